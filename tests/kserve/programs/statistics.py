"""Inference statistics: counts that move by exactly the requests made."""

import numpy as np
import tritonclient.grpc as grpcclient
from _common import arguments, closed_at_exit, fail

args, headers = arguments()
client = closed_at_exit(grpcclient.InferenceServerClient(url=args.url))


def count():
    stats = client.get_inference_statistics(model_name="simple", headers=headers)
    (model,) = stats.model_stats
    return model.inference_count, model.inference_stats.success.count


before = count()
inputs = [
    grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
    grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
]
inputs[0].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
for _ in range(5):
    client.infer("simple", inputs, headers=headers)
after = count()
if (after[0] - before[0], after[1] - before[1]) != (5, 5):
    fail(f"statistics moved from {before} to {after} for 5 requests")
every = client.get_inference_statistics(headers=headers)
if "simple" not in {m.name for m in every.model_stats}:
    fail("statistics of every model leave out simple")
print("PASS: statistics")
