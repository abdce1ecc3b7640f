"""Owned system shared memory over HTTP: the gRPC door's rules, reached through HTTP.

An HTTP caller on the loopback is the same client as its gRPC calls (same tenant, same
user): a region registered over one is used over the other. Another tenant sees none of
it; a key that names what it should not is refused with the gRPC door's message.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from tests.kserve.harness import SHM, Door, make_object
from tests.kserve_http.conftest import HttpDaemon


class Connection:
    """One kept-alive HTTP connection (the caller's client lives while it is open)."""

    def __init__(self, served: HttpDaemon, token: str) -> None:
        host, port = served.http.rsplit(":", 1)
        self.http = http.client.HTTPConnection(host, int(port), timeout=30)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def __call__(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        self.http.request(method, path, data, self.headers)
        answer = self.http.getresponse()
        return answer.status, json.loads(answer.read())

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def key() -> Iterator[str]:
    name = f"accy_http_{os.getpid()}"
    make_object(
        name, 256, np.arange(16, dtype=np.int32).tobytes() + np.ones(16, np.int32).tobytes()
    )
    yield f"/{name}"
    (SHM / name).unlink(missing_ok=True)


def test_a_region_registered_over_http_is_used_over_grpc_and_not_by_another_tenant(
    guarded_http: HttpDaemon, http_tokens: tuple[Path, dict[str, str]], key: str
) -> None:
    tokens = http_tokens[1]
    alpha, beta = (
        Connection(guarded_http, tokens["alpha"]),
        Connection(guarded_http, tokens["beta"]),
    )
    assert guarded_http.daemon.tcp_target is not None
    door = Door(guarded_http.daemon.tcp_target, tokens["alpha"])
    try:
        status, _ = alpha(
            "POST", "/v2/systemsharedmemory/region/ins/register", {"key": key, "byte_size": 256}
        )
        assert status == 200
        assert door.regions() == {"ins"}  # the same caller over gRPC
        assert beta("GET", "/v2/systemsharedmemory/status") == (200, [])
        request = pb.ModelInferRequest(model_name="simple")
        for index, name in enumerate(("INPUT0", "INPUT1")):
            tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            tensor.parameters["shared_memory_region"].string_param = "ins"
            tensor.parameters["shared_memory_byte_size"].int64_param = 64
            tensor.parameters["shared_memory_offset"].int64_param = 64 * index
        answer = door("ModelInfer", request)
        assert np.array_equal(
            np.frombuffer(answer.raw_output_contents[0], np.int32), np.arange(1, 17)
        )
        # beta cannot name alpha's region: as an unknown one
        body = {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32",
                 "parameters": {"shared_memory_region": "ins", "shared_memory_byte_size": 64}}
                for n in ("INPUT0", "INPUT1")
            ]
        }  # fmt: skip
        status, refused = beta("POST", "/v2/models/simple/infer", body)
        assert status == 404 and "ins" in refused["error"], refused
        status, region = alpha("GET", "/v2/systemsharedmemory/region/ins/status")
        assert (status, region) == (
            200,
            [{"name": "ins", "key": key, "offset": 0, "byte_size": 256}],
        )
        assert alpha("POST", "/v2/systemsharedmemory/unregister") == (200, {})
        assert door.regions() == set()
    finally:
        for connection in (alpha, beta):
            connection.close()
        door.close()


def test_a_key_out_of_the_shared_memory_folder_is_refused(
    guarded_http: HttpDaemon, http_tokens: tuple[Path, dict[str, str]]
) -> None:
    alpha = Connection(guarded_http, http_tokens[1]["alpha"])
    try:
        status, refused = alpha(
            "POST",
            "/v2/systemsharedmemory/region/r/register",
            {"key": "/../etc/passwd", "byte_size": 8},
        )
        assert status == 400 and "key" in refused["error"], refused
    finally:
        alpha.close()
