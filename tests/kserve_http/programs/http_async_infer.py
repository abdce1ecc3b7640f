"""tritonclient's simple_http_async_infer_client: two requests in flight at once, binary
inputs and outputs."""

import numpy as np
import tritonclient.http as httpclient
from _common import arguments, closed_at_exit, fail

args, headers = arguments()
request_count = 2
# Concurrency enough to issue every request to the server in parallel.
triton_client = closed_at_exit(
    httpclient.InferenceServerClient(url=args.url, concurrency=request_count)
)
model_name = "simple"

inputs = [
    httpclient.InferInput("INPUT0", [1, 16], "INT32"),
    httpclient.InferInput("INPUT1", [1, 16], "INT32"),
]
input0_data = np.expand_dims(np.arange(start=0, stop=16, dtype=np.int32), axis=0)
input1_data = np.ones(shape=(1, 16), dtype=np.int32)
inputs[0].set_data_from_numpy(input0_data, binary_data=True)
inputs[1].set_data_from_numpy(input1_data, binary_data=True)
outputs = [
    httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
    httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
]
async_requests = [
    triton_client.async_infer(
        model_name=model_name, inputs=inputs, outputs=outputs, headers=headers
    )
    for _ in range(request_count)
]
for async_request in async_requests:
    result = async_request.get_result()  # blocks until the server answers
    print(result.get_response())
    output0_data = result.as_numpy("OUTPUT0")
    output1_data = result.as_numpy("OUTPUT1")
    for i in range(16):
        print(f"{input0_data[0][i]} + {input1_data[0][i]} = {output0_data[0][i]}")
        print(f"{input0_data[0][i]} - {input1_data[0][i]} = {output1_data[0][i]}")
        if (input0_data[0][i] + input1_data[0][i]) != output0_data[0][i]:
            fail("async infer error: incorrect sum")
        if (input0_data[0][i] - input1_data[0][i]) != output1_data[0][i]:
            fail("async infer error: incorrect difference")
print("PASS: async infer")
