"""The KServe HTTP door answered over plain HTTP: health, metadata, JSON and binary tensors,
and every refusal as ``{"error": ...}`` with the HTTP status of the gRPC door's code."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from shutil import which

import numpy as np
import pytest

from tests.kserve_http.conftest import HttpDaemon
from tests.kserve_http.harness import call, simple_inputs

A = list(range(16))
B = [3] * 16


def test_health_and_server_metadata(plain_http: HttpDaemon) -> None:
    assert call(plain_http.base, "/v2/health/live").json() == {"live": True}
    assert call(plain_http.base, "/v2/health/ready").json() == {"ready": True}
    metadata = call(plain_http.base, "/v2").json()
    assert metadata["name"] == "accyd"
    assert "system_shared_memory" in metadata["extensions"]
    ready = call(plain_http.base, "/v2/models/simple/versions/1/ready")
    assert (ready.status, ready.json()) == (200, {"name": "simple", "ready": True})
    assert call(plain_http.base, "/v2/models/nope/ready").status == 503


@pytest.mark.skipif(which("curl") is None, reason="no curl here")
def test_curl_health_and_infer(plain_http: HttpDaemon) -> None:
    """As the docs show it: curl on readiness and a JSON inference."""
    ready = subprocess.run(
        ["curl", "-sf", f"{plain_http.base}/v2/health/ready"], capture_output=True, check=True
    )
    assert json.loads(ready.stdout) == {"ready": True}
    body = json.dumps({"inputs": simple_inputs(A, B)})
    done = subprocess.run(
        ["curl", "-sf", "-H", "Content-Type: application/json", "-d", body,
         f"{plain_http.base}/v2/models/simple/infer"],
        capture_output=True, check=True,
    )  # fmt: skip
    outputs = {o["name"]: o for o in json.loads(done.stdout)["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [a + b for a, b in zip(A, B, strict=True)]
    assert outputs["OUTPUT1"]["shape"] == [1, 16]


def test_json_infer_with_inputs_in_any_order(plain_http: HttpDaemon) -> None:
    """Inputs given INPUT1 first still land on their operands (the difference says so)."""
    body = {"id": "r1", "inputs": simple_inputs(A, B)[::-1], "outputs": [{"name": "OUTPUT1"}]}
    answer = call(plain_http.base, "/v2/models/simple/infer", body).json()
    assert answer["id"] == "r1" and answer["model_name"] == "simple"
    assert [o["name"] for o in answer["outputs"]] == ["OUTPUT1"]
    assert answer["outputs"][0]["data"] == [a - b for a, b in zip(A, B, strict=True)]


def test_binary_tensors_both_ways(plain_http: HttpDaemon) -> None:
    """The binary extension: INPUT1 after the JSON header, OUTPUT0 binary, OUTPUT1 JSON."""
    a = np.arange(16, dtype=np.int32)
    b = np.full(16, -5, dtype=np.int32)
    inputs = simple_inputs(A, [])
    del inputs[1]["data"]
    inputs[1]["parameters"] = {"binary_data_size": b.nbytes}
    header = json.dumps(
        {
            "inputs": inputs,
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"binary_data": True}},
                {"name": "OUTPUT1", "parameters": {"binary_data": False}},
            ],
        }
    ).encode()
    answer = call(
        plain_http.base,
        "/v2/models/simple/infer",
        header + b.tobytes(),
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert answer.status == 200, answer
    length = int(answer.headers["Inference-Header-Content-Length"])
    head = json.loads(answer.body[:length])
    first, second = head["outputs"]
    assert first["parameters"] == {"binary_data_size": 64} and "data" not in first
    assert np.array_equal(np.frombuffer(answer.body[length:], np.int32), a + b)
    assert second["data"] == (a - b).tolist()


def test_statistics_and_repository(plain_http: HttpDaemon) -> None:
    call(plain_http.base, "/v2/models/simple/infer", {"inputs": simple_inputs(A, B)})
    stats = call(plain_http.base, "/v2/models/simple/stats").json()["model_stats"]
    assert [s["name"] for s in stats] == ["simple"]
    assert isinstance(stats[0]["inference_count"], int) and stats[0]["inference_count"] >= 1
    index = call(plain_http.base, "/v2/repository/index", {"ready": True}).json()
    assert {"name": "simple", "version": "1", "state": "READY", "reason": ""} in index


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v2/models/simple/infer", b"{not json", 400, "not JSON"),
        ("/v2/models/simple/infer", {"inputs": "x"}, 400, "inputs must be a JSON array"),
        ("/v2/models/simple/infer", {"inputs": simple_inputs(A[:15], B)}, 400, "needs 16 values"),
        ("/v2/models/simple/infer", {"inputs": simple_inputs(A, B)[:1]}, 400, "needs inputs"),
        (
            "/v2/models/simple/infer",
            {"inputs": [{**simple_inputs(A, B)[0], "datatype": "FP32"}, simple_inputs(A, B)[1]]},
            400,
            "is INT32, not FP32",
        ),
        ("/v2/models/simple/infer", {"inputs": simple_inputs([1.5] * 16, B)}, 400, "integer"),
        ("/v2/models/simple/infer", {"inputs": simple_inputs([1 << 40] * 16, B)}, 400, "fit"),
        (
            "/v2/models/simple/infer",
            {"inputs": simple_inputs(A, B), "parameters": {"bogus": 1}},
            400,
            "no parameter 'bogus'",
        ),
        ("/v2/models/nope/infer", {"inputs": simple_inputs(A, B)}, 404, "no model 'nope'"),
        ("/v2/models/simple/versions/9", None, 404, "no version 9"),
        ("/v2/no/such/route", None, 404, "no route GET /v2/no/such/route"),
        ("/v2/health/live", b"{}", 405, "POST is not served"),
        (
            "/v2/systemsharedmemory/region/r/register",
            {"key": "/../etc", "byte_size": 8},
            400,
            "key",
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            {"key": "/x", "byte_size": -1},
            400,
            "byte_size",
        ),
        (f"/v2/systemsharedmemory/region/{'r' * 300}/unregister", b"", 400, "longer than 256"),
    ],
)
def test_a_bad_request_is_answered_with_a_clear_json_error(
    plain_http: HttpDaemon, path: str, body: bytes | dict[str, object] | None, status: int,
    words: str,
) -> None:  # fmt: skip
    answer = call(plain_http.base, path, body)
    assert answer.status == status, answer
    assert words in answer.error, answer.error


def test_a_binary_header_past_the_body_is_refused(plain_http: HttpDaemon) -> None:
    header = json.dumps({"inputs": simple_inputs(A, B)}).encode()
    answer = call(
        plain_http.base,
        "/v2/models/simple/infer",
        header,
        {"Inference-Header-Content-Length": str(len(header) + 1)},
    )
    assert answer.status == 400 and "Inference-Header-Content-Length" in answer.error


def test_a_body_past_the_largest_message_is_refused_unread(plain_http: HttpDaemon) -> None:
    """64 MiB is the daemon's largest message: a bigger body is answered 413 at once."""
    answer = call(plain_http.base, "/v2/models/simple/infer", b"x" * ((64 << 20) + 1))
    assert answer.status == 413, answer
    assert "67108864" in answer.error


def test_tokens_are_needed_and_tenants_kept_apart(
    guarded_http: HttpDaemon, http_tokens: tuple[Path, dict[str, str]]
) -> None:
    tokens = http_tokens[1]
    base = guarded_http.base
    refused = call(base, "/v2/models/simple/infer", {"inputs": simple_inputs(A, B)})
    assert refused.status == 401 and "Bearer" in refused.error
    assert refused.headers.get("WWW-Authenticate") == "Bearer"
    wrong = call(base, "/v2/health/ready", token="accy_not_a_token")
    assert wrong.status == 401 and "not valid" in wrong.error
    answer = call(
        base, "/v2/models/simple/infer", {"inputs": simple_inputs(A, B)}, token=tokens["alpha"]
    )
    assert answer.status == 200, answer
    # Statistics are the tenant's own: beta has run nothing.
    beta = call(base, "/v2/models/simple/stats", token=tokens["beta"]).json()["model_stats"]
    assert beta[0]["inference_count"] == 0
    alpha = call(base, "/v2/models/simple/stats", token=tokens["alpha"]).json()["model_stats"]
    assert alpha[0]["inference_count"] >= 1


def test_large_json_tensors_both_ways(plain_http: HttpDaemon) -> None:
    """Past 64 KiB the JSON is parsed and written off the event loop: the same answer."""
    n = 50_000
    body = {"inputs": [{"name": "x", "shape": [n], "datatype": "FP32", "data": [1.0] * n}]}
    answer = call(plain_http.base, "/v2/models/accy.kernel.device_scan/infer", body)
    assert answer.status == 200, answer
    (output,) = answer.json()["outputs"]
    assert output["shape"] == [n] and output["data"][-1] == float(n)


def test_json_nested_too_deep_is_refused(plain_http: HttpDaemon) -> None:
    body = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = call(plain_http.base, "/v2/models/simple/infer", body)
    assert answer.status == 400 and "nests too deep" in answer.error
