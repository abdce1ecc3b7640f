"""Half precision, bfloat16, small integers, booleans and shapes through tritonclient."""

import ml_dtypes
import numpy as np
import tritonclient.grpc as grpcclient
from _common import arguments, closed_at_exit, fail

args, headers = arguments()
client = closed_at_exit(grpcclient.InferenceServerClient(url=args.url))
rng = np.random.default_rng(5)


def infer(model, arrays, **parameters):
    inputs = []
    for name, array, datatype in arrays:
        item = grpcclient.InferInput(name, list(array.shape), datatype)
        item.set_data_from_numpy(array)
        inputs.append(item)
    return client.infer(model, inputs, parameters=parameters or None, headers=headers)


x = rng.standard_normal(1000).astype(np.float16)
y = rng.standard_normal(1000).astype(np.float16)
out = infer("dt.axpy_f16", [("x", x, "FP16"), ("y", y, "FP16")], a=0.5).as_numpy("out")
want = (np.float32(0.5) * x.astype(np.float32) + y).astype(np.float16)
if out.dtype != np.float16 or not np.array_equal(out, want):
    fail(f"FP16 axpy gave {out[:4]} ({out.dtype}), expected {want[:4]}")

b = rng.standard_normal(300).astype(ml_dtypes.bfloat16)
got = infer("dt.scale_bf16", [("x", b, "BF16")], s=2.0).as_numpy("out")
want_b = (b.astype(np.float32) * 2 + b).astype(ml_dtypes.bfloat16)
if got.dtype != np.dtype(ml_dtypes.bfloat16) or not np.array_equal(got, want_b):
    fail(f"BF16 scale gave {got[:4]} ({got.dtype})")

for model, datatype, array in (
    ("dt.copy_i8", "INT8", rng.integers(-128, 127, 50, dtype=np.int8)),
    ("dt.copy_i16", "INT16", rng.integers(-30000, 30000, 50, dtype=np.int16)),
    ("dt.copy_u16", "UINT16", rng.integers(0, 65535, 50, dtype=np.uint16)),
    ("dt.copy_bool", "BOOL", rng.integers(0, 2, 50).astype(bool)),
):
    copied = infer(model, [("x", array, datatype)]).as_numpy("y")
    if copied.dtype != array.dtype or not np.array_equal(copied, array):
        fail(f"{datatype} copy gave {copied[:4]} ({copied.dtype})")

m = rng.standard_normal((5, 3)).astype(np.float32)
result = infer("dt.transpose", [("x", m, "FP32")])
t = result.as_numpy("y")
if t.shape != (3, 5) or not np.array_equal(t, m.T):
    fail(f"the transpose came back with shape {t.shape}")
metadata = client.get_model_metadata("dt.transpose", headers=headers)
if [list(o.shape) for o in metadata.outputs] != [[-1, -1]] or metadata.inputs[0].datatype != "FP32":
    fail(f"metadata: {metadata}")
print("PASS: user types")
