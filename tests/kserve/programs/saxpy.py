"""accy's saxpy through tritonclient: n from the inputs' length, a as a request parameter."""

import numpy as np
import tritonclient.grpc as grpcclient
from _common import arguments, closed_at_exit, fail

args, headers = arguments()
client = closed_at_exit(grpcclient.InferenceServerClient(url=args.url))
x = np.random.default_rng(7).random(1000, dtype=np.float32)
y = np.random.default_rng(8).random(1000, dtype=np.float32)
inputs = [grpcclient.InferInput("x", [1000], "FP32"), grpcclient.InferInput("y", [1000], "FP32")]
inputs[0].set_data_from_numpy(x)
inputs[1].set_data_from_numpy(y)
results = client.infer("accy.kernel.saxpy", inputs, parameters={"a": 2.0}, headers=headers)
out = results.as_numpy("out")
if out.shape != (1000,) or not np.allclose(out, np.float32(2.0) * x + y, rtol=1e-6):
    fail(f"saxpy gave {out[:4]}")
try:
    client.infer("accy.kernel.saxpy", inputs, parameters={"b": 2.0}, headers=headers)
except Exception as error:  # an unknown parameter is refused, naming what the model takes
    if "runtime scalars" not in str(error):
        fail(f"an unknown parameter failed with {error}")
else:
    fail("an unknown parameter was accepted")
print("PASS: saxpy")
