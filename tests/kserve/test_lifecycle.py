"""The door's lifecycle: turned off by a flag, clients freed when silent, models loaded and
unloaded per caller, what is not served said so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from accy.testing import RunningDaemon, running_daemon
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from tests.kserve.harness import SHM, Door, descriptors, make_object, simple_request, wait_until

INTS = np.arange(16, dtype=np.int32)


@pytest.fixture(scope="module")
def short_lived() -> Iterator[RunningDaemon]:
    """A daemon that frees a KServe caller's state after 1 s without a call."""
    extra = ["--no-supervise", "--kserve-liveness-seconds", "1"]
    with running_daemon(backend="host", tcp=False, extra=extra) as running:
        yield running


def test_no_kserve_turns_the_door_off() -> None:
    with running_daemon(backend="host", tcp=False, extra=["--no-kserve"]) as daemon:
        door = Door(daemon.unix_target)
        error = door.refusal("ServerLive", pb.ServerLiveRequest())
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        door.close()


def test_a_silent_callers_regions_and_sessions_are_freed(short_lived: RunningDaemon) -> None:
    path: Path = make_object("kserve_t_silent", 128, INTS.tobytes() * 2)
    try:
        door = Door(short_lived.unix_target)
        door("ServerLive", pb.ServerLiveRequest())  # connected: its socket is in the baseline
        fds = descriptors(short_lived)
        door.register("r", "/kserve_t_silent", 128)
        door("ModelInfer", simple_request(regions=[("r", 0), ("r", 64)]))
        assert descriptors(short_lived) > fds
        wait_until(lambda: descriptors(short_lived) <= fds, what="the silent client freed")
        assert door.regions() == set()  # a new client: the old one's regions went with it
        door.close()
    finally:
        path.unlink(missing_ok=True)
        assert not (SHM / "kserve_t_silent").exists()


def test_load_and_unload_touch_the_callers_own_sessions(plain: RunningDaemon) -> None:
    mine, other = Door(plain.unix_target), Door(plain.tcp_target or "")
    mine("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="accy.kernel.saxpy"))
    other("ModelInfer", simple_request(INTS, INTS))
    other("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="simple"))
    answer = other("ModelInfer", simple_request(INTS, INTS))  # loaded again at need
    assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.int32), INTS * 2)
    error = mine.refusal("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    index = mine("RepositoryIndex", pb.RepositoryIndexRequest(ready=True))
    assert {"simple", "accy.kernel.saxpy"} <= {m.name for m in index.models}
    assert all(m.state == "READY" for m in index.models)
    mine.close()
    other.close()


def test_what_is_not_served_says_so(plain: RunningDaemon) -> None:
    door = Door(plain.unix_target)
    assert not door("ModelReady", pb.ModelReadyRequest(name="nope")).ready
    assert door("ModelReady", pb.ModelReadyRequest(name="simple", version="1")).ready
    for method, request in (
        ("TraceSetting", pb.TraceSettingRequest()),
        ("LogSettings", pb.LogSettingsRequest()),
    ):
        assert door.refusal(method, request).code() == grpc.StatusCode.UNIMPLEMENTED
    error = door.refusal(
        "CudaSharedMemoryRegister",
        pb.CudaSharedMemoryRegisterRequest(name="c", raw_handle=bytes(64), byte_size=64),
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--kserve-cuda-shared-memory" in (error.details() or "")
    assert not door("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest()).regions
    door("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest())
    metadata = door("ServerMetadata", pb.ServerMetadataRequest())
    assert "system_shared_memory" in metadata.extensions
    assert "cuda_shared_memory" not in metadata.extensions
    door.close()
