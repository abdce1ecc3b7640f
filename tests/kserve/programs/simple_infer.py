"""tritonclient's simple_grpc_infer_client: sum and difference of two vectors."""

import numpy as np
import tritonclient.grpc as grpcclient
from _common import arguments, closed_at_exit, fail

args, headers = arguments([("--no-outputs", {"action": "store_true"})])
client = closed_at_exit(grpcclient.InferenceServerClient(url=args.url))
model_name = "simple"

inputs = [
    grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
    grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
]
input0_data = np.expand_dims(np.arange(start=0, stop=16, dtype=np.int32), axis=0)
input1_data = np.full(shape=(1, 16), fill_value=-1, dtype=np.int32)
inputs[0].set_data_from_numpy(input0_data)
inputs[1].set_data_from_numpy(input1_data)
outputs = None
if not args.no_outputs:
    outputs = [
        grpcclient.InferRequestedOutput("OUTPUT0"),
        grpcclient.InferRequestedOutput("OUTPUT1"),
    ]

results = client.infer(
    model_name=model_name, inputs=inputs, outputs=outputs, headers=headers, request_id="one"
)
statistics = client.get_inference_statistics(model_name=model_name, headers=headers)
if len(statistics.model_stats) != 1:
    fail("inference statistics failed")

output0_data = results.as_numpy("OUTPUT0")
output1_data = results.as_numpy("OUTPUT1")
if results.get_response().id != "one":
    fail("the response does not carry the request's id")
for i in range(16):
    print(f"{input0_data[0][i]} + {input1_data[0][i]} = {output0_data[0][i]}")
    print(f"{input0_data[0][i]} - {input1_data[0][i]} = {output1_data[0][i]}")
    if (input0_data[0][i] + input1_data[0][i]) != output0_data[0][i]:
        fail("sync infer error: incorrect sum")
    if (input0_data[0][i] - input1_data[0][i]) != output1_data[0][i]:
        fail("sync infer error: incorrect difference")
print("PASS: infer")
