"""tritonclient's simple_grpc_async_infer_client: async_infer with a callback."""

import queue
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
from _common import arguments, closed_at_exit, fail

args, headers = arguments()
client = closed_at_exit(grpcclient.InferenceServerClient(url=args.url))
model_name = "simple"
completed: queue.Queue = queue.Queue()


def callback(user_data, result, error):
    user_data.put(error if error else result)


input0_data = np.arange(start=0, stop=16, dtype=np.int32).reshape(1, 16)
input1_data = np.ones(shape=(1, 16), dtype=np.int32)
count = 20
for _ in range(count):
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(input0_data)
    inputs[1].set_data_from_numpy(input1_data)
    outputs = [
        grpcclient.InferRequestedOutput("OUTPUT0"),
        grpcclient.InferRequestedOutput("OUTPUT1"),
    ]
    client.async_infer(
        model_name=model_name,
        inputs=inputs,
        callback=partial(callback, completed),
        outputs=outputs,
        headers=headers,
    )

for _ in range(count):
    result = completed.get(timeout=60)
    if isinstance(result, Exception):
        fail(f"async infer failed: {result}")
    if not np.array_equal(result.as_numpy("OUTPUT0"), input0_data + input1_data):
        fail("async infer error: incorrect sum")
    if not np.array_equal(result.as_numpy("OUTPUT1"), input0_data - input1_data):
        fail("async infer error: incorrect difference")
print("PASS: async infer")
