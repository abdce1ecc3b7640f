"""tritonclient's simple_grpc_cudashm_client, on accy's device_scan: the input and the output
in CUDA shared memory (the daemon must run with --kserve-cuda-shared-memory)."""

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.cuda_shared_memory as cudashm
from _common import arguments, closed_at_exit, fail
from tritonclient import utils

args, headers = arguments([("--n", {"type": int, "default": 1 << 20})])
triton_client = closed_at_exit(grpcclient.InferenceServerClient(url=args.url))
triton_client.unregister_system_shared_memory(headers=headers)
triton_client.unregister_cuda_shared_memory(headers=headers)

x = np.random.default_rng(3).random(args.n, dtype=np.float32)
byte_size = x.nbytes
shm_op_handle = cudashm.create_shared_memory_region("output_data", byte_size, 0)
triton_client.register_cuda_shared_memory(
    "output_data", cudashm.get_raw_handle(shm_op_handle), 0, byte_size, headers=headers
)
shm_ip_handle = cudashm.create_shared_memory_region("input_data", byte_size, 0)
cudashm.set_shared_memory_region(shm_ip_handle, [x])
triton_client.register_cuda_shared_memory(
    "input_data", cudashm.get_raw_handle(shm_ip_handle), 0, byte_size, headers=headers
)
inputs = [grpcclient.InferInput("x", [args.n], "FP32")]
inputs[-1].set_shared_memory("input_data", byte_size)
outputs = [grpcclient.InferRequestedOutput("y")]
outputs[-1].set_shared_memory("output_data", byte_size)
results = triton_client.infer(
    model_name="accy.kernel.device_scan", inputs=inputs, outputs=outputs, headers=headers
)
output = results.get_output("y")
if output is None:
    fail("y is missing in the response")
y = cudashm.get_contents_as_numpy(
    shm_op_handle, utils.triton_to_np_dtype(output.datatype), output.shape
)
want = np.cumsum(x, dtype=np.float64)
error = float(np.linalg.norm(y - want) / np.linalg.norm(want))
if error > 1e-5:
    fail(f"device_scan through CUDA shared memory: relative error {error}")
status = triton_client.get_cuda_shared_memory_status(headers=headers)
if set(status.regions) != {"input_data", "output_data"}:
    fail(f"CUDA shared memory status: {status}")
triton_client.unregister_cuda_shared_memory(headers=headers)
cudashm.destroy_shared_memory_region(shm_ip_handle)
cudashm.destroy_shared_memory_region(shm_op_handle)
print(f"PASS: CUDA shared memory, device_scan n={args.n}, relative error {error:.2e}")
