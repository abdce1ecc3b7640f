"""tritonclient's simple_http_shm_client, call for call: one region for both inputs, one for
both outputs, each tensor at its own offset, every region of this client unregistered first
and last."""

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from _common import arguments, closed_at_exit, fail
from tritonclient import utils

args, headers = arguments([("--suffix", {"default": ""})])
triton_client = closed_at_exit(httpclient.InferenceServerClient(url=args.url))

# To make sure no shared memory regions are registered with the server.
triton_client.unregister_system_shared_memory(headers=headers)
triton_client.unregister_cuda_shared_memory(headers=headers)

model_name = "simple"
input0_data = np.arange(start=0, stop=16, dtype=np.int32)
input1_data = np.ones(shape=16, dtype=np.int32)
input_byte_size = input0_data.size * input0_data.itemsize
output_byte_size = input_byte_size
output_key, input_key = f"/output_simple{args.suffix}", f"/input_simple{args.suffix}"

shm_op_handle = shm.create_shared_memory_region("output_data", output_key, output_byte_size * 2)
triton_client.register_system_shared_memory(
    "output_data", output_key, output_byte_size * 2, headers=headers
)
shm_ip_handle = shm.create_shared_memory_region("input_data", input_key, input_byte_size * 2)
shm.set_shared_memory_region(shm_ip_handle, [input0_data])
shm.set_shared_memory_region(shm_ip_handle, [input1_data], offset=input_byte_size)
triton_client.register_system_shared_memory(
    "input_data", input_key, input_byte_size * 2, headers=headers
)

inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32")]
inputs[-1].set_shared_memory("input_data", input_byte_size)
inputs.append(httpclient.InferInput("INPUT1", [1, 16], "INT32"))
inputs[-1].set_shared_memory("input_data", input_byte_size, offset=input_byte_size)
outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
outputs[-1].set_shared_memory("output_data", output_byte_size)
outputs.append(httpclient.InferRequestedOutput("OUTPUT1", binary_data=True))
outputs[-1].set_shared_memory("output_data", output_byte_size, offset=output_byte_size)

results = triton_client.infer(
    model_name=model_name, inputs=inputs, outputs=outputs, headers=headers
)

output0 = results.get_output("OUTPUT0")
if output0 is None:
    fail("OUTPUT0 is missing in the response")
output0_data = shm.get_contents_as_numpy(
    shm_op_handle, utils.triton_to_np_dtype(output0["datatype"]), output0["shape"]
)
output1 = results.get_output("OUTPUT1")
if output1 is None:
    fail("OUTPUT1 is missing in the response")
output1_data = shm.get_contents_as_numpy(
    shm_op_handle,
    utils.triton_to_np_dtype(output1["datatype"]),
    output1["shape"],
    offset=output_byte_size,
)
for i in range(16):
    print(f"{input0_data[i]} + {input1_data[i]} = {output0_data[0][i]}")
    print(f"{input0_data[i]} - {input1_data[i]} = {output1_data[0][i]}")
    if (input0_data[i] + input1_data[i]) != output0_data[0][i]:
        fail("shm infer error: incorrect sum")
    if (input0_data[i] - input1_data[i]) != output1_data[0][i]:
        fail("shm infer error: incorrect difference")

status = triton_client.get_system_shared_memory_status(headers=headers)
print(status)
if sorted(region["name"] for region in status) != ["input_data", "output_data"]:
    fail(f"system shared memory status: {status}")
triton_client.unregister_system_shared_memory(headers=headers)
if triton_client.get_system_shared_memory_status(headers=headers):
    fail("regions left after unregistering them all")
assert len(shm.mapped_shared_memory_regions()) == 2
shm.destroy_shared_memory_region(shm_ip_handle)
shm.destroy_shared_memory_region(shm_op_handle)
assert len(shm.mapped_shared_memory_regions()) == 0
print("PASS: system shared memory")
