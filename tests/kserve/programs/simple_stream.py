"""Streaming inference: start_stream, async_stream_infer, stop_stream, as tritonclient's
stream examples call them; each answer is matched to its request by id."""

import queue
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
from _common import arguments, closed_at_exit, fail

args, headers = arguments()
client = closed_at_exit(grpcclient.InferenceServerClient(url=args.url))
answers: queue.Queue = queue.Queue()


def callback(user_data, result, error):
    user_data.put(error if error else result)


client.start_stream(callback=partial(callback, answers), headers=headers)
sent = {}
for k in range(10):
    a = np.full((1, 16), k, dtype=np.int32)
    b = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    client.async_stream_infer(model_name="simple", inputs=inputs, request_id=str(k))
    sent[str(k)] = (a, b)
# One that fails: an input of the wrong type comes back as an error on the stream.
bad = [
    grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
    grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
]
bad[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
bad[1].set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
client.async_stream_infer(model_name="simple", inputs=bad, request_id="bad")

errors = 0
for _ in range(len(sent) + 1):
    result = answers.get(timeout=60)
    if isinstance(result, Exception):
        errors += 1
        if "INT32" not in str(result):
            fail(f"the bad request failed with {result}")
        continue
    a, b = sent.pop(result.get_response().id)
    if not np.array_equal(result.as_numpy("OUTPUT0"), a + b):
        fail("stream infer error: incorrect sum")
    if not np.array_equal(result.as_numpy("OUTPUT1"), a - b):
        fail("stream infer error: incorrect difference")
client.stop_stream()
if sent or errors != 1:
    fail(f"unanswered: {sorted(sent)}; errors: {errors}")
print("PASS: streaming infer")
