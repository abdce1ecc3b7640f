"""Property-based fuzzing of the HTTP door's inference route: generated JSON headers and
binary tails, well-formed and not, are answered 200 or refused with ``{"error": ...}`` and a
4xx status; never a 500 (an internal error), never a hang. The daemon serves on after."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kserve_http.conftest import HttpDaemon
from tests.kserve_http.harness import call, simple_inputs

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
_names = st.sampled_from(["INPUT0", "INPUT1", "OUTPUT0", "x", ""]) | st.text(max_size=6)
_datatypes = st.sampled_from(["INT32", "FP32", "BOOL", "UINT8", "FP16", "BF16", "BYTES", ""])
_parameters = st.dictionaries(
    st.sampled_from(
        ["binary_data_size", "shared_memory_region", "shared_memory_byte_size",
         "shared_memory_offset", "binary_data", "a", "n"]
    ),
    _scalars,
    max_size=3,
)  # fmt: skip
_tensor = st.fixed_dictionaries(
    {"name": _names, "datatype": _datatypes},
    optional={
        "shape": st.lists(st.integers(-2, 40), max_size=3) | _json,
        "data": st.lists(st.integers(-5, 5), max_size=20) | _json,
        "parameters": _parameters | _json,
    },
)
_header = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=5) | _scalars,
        "inputs": st.lists(_tensor, max_size=3) | _json,
        "outputs": st.lists(
            st.fixed_dictionaries({"name": _names}, optional={"parameters": _parameters}),
            max_size=3,
        ),
        "parameters": _parameters | _json,
    },
)
_models = st.sampled_from(["simple", "accy.kernel.device_scan", "accy.kernel.saxpy", "nope"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    header=_header | _json,
    tail=st.binary(max_size=80),
    binary=st.booleans(),
    model=_models,
)
def test_fuzzed_inference_is_answered_or_refused_never_an_internal_error(
    plain_http: HttpDaemon, header: Any, tail: bytes, binary: bool, model: str
) -> None:
    text = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(text))} if binary else {}
    answer = call(
        plain_http.base, f"/v2/models/{model}/infer", text + (tail if binary else b""), headers
    )
    if answer.status != 200:
        assert 400 <= answer.status < 500, answer
        assert answer.error


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, 1),
    key=st.sampled_from(["name", "datatype", "shape", "data", "parameters"]),
    value=_json | _parameters | st.lists(st.integers(0, 40), max_size=3),
    outputs=st.none()
    | st.lists(
        st.fixed_dictionaries({"name": _names}, optional={"parameters": _parameters}),
        max_size=3,
    ),
    request_parameters=_parameters,
)
def test_one_field_of_a_good_request_changed_is_answered_or_refused(
    plain_http: HttpDaemon,
    which: int,
    key: str,
    value: Any,
    outputs: Any,
    request_parameters: Any,
) -> None:
    inputs: list[dict[str, Any]] = simple_inputs(list(range(16)), [1] * 16)
    inputs[which][key] = value
    body: dict[str, Any] = {"inputs": inputs, "parameters": request_parameters}
    if outputs is not None:
        body["outputs"] = outputs
    answer = call(plain_http.base, "/v2/models/simple/infer", body)
    if answer.status != 200:
        assert 400 <= answer.status < 500, answer
        assert answer.error


def test_the_door_serves_on_after_fuzzing(plain_http: HttpDaemon) -> None:
    answer = call(
        plain_http.base, "/v2/models/simple/infer", {"inputs": simple_inputs([1] * 16, [2] * 16)}
    )
    assert answer.json()["outputs"][0]["data"] == [3] * 16
    assert plain_http.daemon.process.poll() is None
    log = plain_http.daemon.log.read_text(errors="replace")
    assert "call failed" not in log  # no internal error logged
