"""tritonclient's simple_http_health_metadata: health, server and model metadata, and the
refusal of an unknown model."""

import tritonclient.http as httpclient
from _common import arguments, closed_at_exit, fail
from tritonclient.utils import InferenceServerException

args, headers = arguments()
triton_client = closed_at_exit(httpclient.InferenceServerClient(url=args.url))
model_name = "simple"

if not triton_client.is_server_live(headers=headers, query_params={"test_1": 1, "test_2": 2}):
    fail("is_server_live")
if not triton_client.is_server_ready(headers=headers):
    fail("is_server_ready")
if not triton_client.is_model_ready(model_name, headers=headers):
    fail("is_model_ready")
if triton_client.is_model_ready("wrong_model_name", headers=headers):
    fail("an unknown model is ready")

metadata = triton_client.get_server_metadata(headers=headers)
if metadata["name"] != "accyd":  # Triton's example looks for "triton"
    fail(f"get_server_metadata: {metadata}")
print(metadata)

metadata = triton_client.get_model_metadata(
    model_name, headers=headers, query_params={"test_1": 1, "test_2": 2}
)
if metadata["name"] != model_name:
    fail(f"get_model_metadata: {metadata}")
if [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] != [
    ("INPUT0", "INT32", [16]),
    ("INPUT1", "INT32", [16]),
]:
    fail(f"inputs: {metadata['inputs']}")
print(metadata)

config = triton_client.get_model_config(model_name, headers=headers)
if config["name"] != model_name or [i["name"] for i in config["input"]] != ["INPUT0", "INPUT1"]:
    fail(f"get_model_config: {config}")
index = triton_client.get_model_repository_index(headers=headers)
if "simple" not in {m["name"] for m in index}:
    fail(f"get_model_repository_index: {index}")

try:
    metadata = triton_client.get_model_metadata("wrong_model_name", headers=headers)
except InferenceServerException as ex:
    if "no model 'wrong_model_name'" not in ex.message() or ex.status() != "404":
        fail(f"get_model_metadata wrong_model_name: {ex.status()} {ex.message()}")
else:
    fail("get_model_metadata wrong_model_name succeeded")
print("PASS: health and metadata")
