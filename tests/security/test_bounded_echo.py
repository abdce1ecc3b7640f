"""A huge client-given name comes back as the real error, clipped, and never fills a log line."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import structlog

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.clipping import clip
from accyd.doors.grpc.status import refusal_fields
from accyd.errors import LaunchArgumentMismatch
from accyd.logs import bound_values
from tests.launch_service.harness import (
    Attached,
    ServerThread,
    attach,
    details,
    make_config,
    rpc_error,
)

HUGE = 10_000_000
CLIPPED = re.compile(r"\.\.\. \(1000000\d chars\)")  # the name, quoted or not
SAXPY = "accy.kernel.saxpy"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Attached]:
    config = make_config(tmp_path, "unix", max_message_bytes=64 << 20)
    running = ServerThread(config)
    options = [("grpc.max_send_message_length", 64 << 20)]
    try:
        with grpc.insecure_channel(running.address, options=options) as channel:
            attached = attach(channel)
            yield attached
            attached.detach()
    finally:
        running.stop()


def test_clip_keeps_short_text_and_says_how_long_long_text_was() -> None:
    assert clip("short") == "short"
    assert clip("x" * 100) == "x" * 64 + "... (100 chars)"


def test_a_log_line_bounds_what_a_refusal_repeats() -> None:
    refusal = LaunchArgumentMismatch(f"no scalar {'n' * HUGE!r}", field="n" * HUGE)
    stream = io.StringIO()
    logger = structlog.wrap_logger(
        structlog.PrintLogger(stream),
        processors=[bound_values, structlog.processors.JSONRenderer()],
    )
    logger.info("call refused", **refusal_fields(refusal))
    line = json.loads(stream.getvalue())
    assert CLIPPED.search(line["error"]) and len(line["error"]) < 4096
    assert len(line["field"]) < 4096


def assert_bounded(error: grpc.RpcError, code: grpc.StatusCode) -> None:
    assert error.code() == code, (error.details() or "")[:200]
    message = error.details() or ""
    assert CLIPPED.search(message) and len(message) < 4096
    info = details(error)["ErrorInfo"]
    assert len(info.metadata.get("field", "")) < 4096


def operands(first_name: str = "x") -> list[pb.Tensor]:
    return [pb.Tensor(name=name, dtype=pb.DTYPE_F32, data=b"\0" * 16) for name in (first_name, "y")]


def test_a_huge_runtime_scalar_name_gets_the_real_error(
    client: Attached,
) -> None:
    attached = client
    scalars = {"n" * HUGE: pb.Scalar(u32=4)}
    request = pb.RunRequest(target=SAXPY, operands=operands(), runtime_scalars=scalars)
    error = rpc_error(lambda: attached.Run(request))
    assert_bounded(error, grpc.StatusCode.INVALID_ARGUMENT)
    assert "has no runtime scalar" in (error.details() or "")


def test_a_huge_tensor_name_gets_the_real_error(client: Attached) -> None:
    attached = client
    scalars = {"n": pb.Scalar(u32=4), "a": pb.Scalar(f32=1.0)}
    request = pb.RunRequest(target=SAXPY, operands=operands("x" * HUGE), runtime_scalars=scalars)
    error = rpc_error(lambda: attached.Run(request))
    assert_bounded(error, grpc.StatusCode.INVALID_ARGUMENT)
