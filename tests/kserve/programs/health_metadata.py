"""Health and metadata, as tritonclient's simple_grpc_health_metadata example asks them."""

import tritonclient.grpc as grpcclient
from _common import arguments, closed_at_exit, fail

args, headers = arguments()
client = closed_at_exit(grpcclient.InferenceServerClient(url=args.url))
model_name = "simple"

if not client.is_server_live(headers=headers):
    fail("the server is not live")
if not client.is_server_ready(headers=headers):
    fail("the server is not ready")
if not client.is_model_ready(model_name, headers=headers):
    fail(f"model {model_name} is not ready")
if client.is_model_ready("no_such_model", headers=headers):
    fail("an unknown model is ready")

metadata = client.get_server_metadata(headers=headers)
if metadata.name != "accyd":
    fail(f"server metadata names {metadata.name}")
print(metadata)

metadata = client.get_model_metadata(model_name, headers=headers)
if metadata.name != model_name:
    fail(f"model metadata names {metadata.name}")
if [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] != [
    ("INPUT0", "INT32", [16]),
    ("INPUT1", "INT32", [16]),
]:
    fail(f"inputs: {metadata.inputs}")
if [t.name for t in metadata.outputs] != ["OUTPUT0", "OUTPUT1"]:
    fail(f"outputs: {metadata.outputs}")
print(metadata)

config = client.get_model_config(model_name, headers=headers).config
if config.name != model_name or [i.name for i in config.input] != ["INPUT0", "INPUT1"]:
    fail(f"model config: {config}")
saxpy = client.get_model_config("accy.kernel.saxpy", headers=headers).config
if set(saxpy.parameters) != {"scalar.n", "scalar.a"}:
    fail(f"saxpy's config lists parameters {set(saxpy.parameters)}")
index = client.get_model_repository_index(headers=headers)
if "simple" not in {m.name for m in index.models}:
    fail(f"repository index: {index}")
print("PASS: health and metadata")
