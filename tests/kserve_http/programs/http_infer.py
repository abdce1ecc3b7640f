"""tritonclient's simple_http_infer_client: one input as JSON and one binary, one output
binary and one JSON; then every output unasked (binary); then an unknown model, refused."""

import numpy as np
import tritonclient.http as httpclient
from _common import arguments, closed_at_exit, fail
from tritonclient.utils import InferenceServerException

args, headers = arguments([("--compression", {"default": None})])
triton_client = closed_at_exit(httpclient.InferenceServerClient(url=args.url))


def test_infer(model_name, input0_data, input1_data):
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(input0_data, binary_data=False)
    inputs[1].set_data_from_numpy(input1_data, binary_data=True)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    return triton_client.infer(
        model_name,
        inputs,
        outputs=outputs,
        query_params={"test_1": 1, "test_2": 2},
        headers=headers,
        request_compression_algorithm=args.compression,
        response_compression_algorithm=args.compression,
    )


def test_infer_no_outputs(model_name, input0_data, input1_data):
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(input0_data, binary_data=False)
    inputs[1].set_data_from_numpy(input1_data, binary_data=True)
    return triton_client.infer(
        model_name,
        inputs,
        outputs=None,
        query_params={"test_1": 1, "test_2": 2},
        headers=headers,
        request_compression_algorithm=args.compression,
        response_compression_algorithm=args.compression,
    )


def check(results):
    output0_data = results.as_numpy("OUTPUT0")
    output1_data = results.as_numpy("OUTPUT1")
    for i in range(16):
        print(f"{input0_data[0][i]} + {input1_data[0][i]} = {output0_data[0][i]}")
        print(f"{input0_data[0][i]} - {input1_data[0][i]} = {output1_data[0][i]}")
        if (input0_data[0][i] + input1_data[0][i]) != output0_data[0][i]:
            fail("sync infer error: incorrect sum")
        if (input0_data[0][i] - input1_data[0][i]) != output1_data[0][i]:
            fail("sync infer error: incorrect difference")


model_name = "simple"
input0_data = np.expand_dims(np.arange(start=0, stop=16, dtype=np.int32), axis=0)
input1_data = np.full(shape=(1, 16), fill_value=-1, dtype=np.int32)

results = test_infer(model_name, input0_data, input1_data)
print(results.get_response())
statistics = triton_client.get_inference_statistics(model_name=model_name, headers=headers)
print(statistics)
if len(statistics["model_stats"]) != 1:
    fail("inference statistics")
check(results)

results = test_infer_no_outputs(model_name, input0_data, input1_data)
print(results.get_response())
check(results)

try:
    test_infer("wrong_model_name", input0_data, input1_data).get_response()
    fail("expected an error for a wrong model name")
except InferenceServerException as ex:
    print(ex)
    if not ex.message().startswith("no model 'wrong_model_name'"):  # Triton's: "Request for..."
        fail("improper error message for wrong model name")
print("PASS: infer")
