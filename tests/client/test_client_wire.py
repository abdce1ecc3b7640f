"""The client against the service double: metadata, chunked transfers, sessions, errors."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from accy import errors
from accy.client import Client
from accy.testing import transport_of
from tests.client.fake_daemon import FakeLaunchService


def test_attach_names_client_and_close_detaches(fake: tuple[str, FakeLaunchService]) -> None:
    target, service = fake
    client = Client(target, client_name="me")
    assert client.client_id in service.state.clients
    assert service.state.clients[client.client_id] == "me"
    assert client.attachment.backend == "fake"
    client.close()
    client.close()  # idempotent
    deadline = time.monotonic() + 5
    while service.state.clients and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not service.state.clients
    with pytest.raises(RuntimeError, match="closed"):
        client.status()


def test_heartbeats_keep_the_stream_alive(client: Client) -> None:
    time.sleep(0.2)
    assert client.attached
    assert client._conn.last.stream.heartbeats >= 1


@pytest.mark.parametrize("nbytes", [0, 1, 4, (1 << 20) - 4, 1 << 20, (5 << 20) + 12])
def test_write_read_round_trip_in_chunks(
    client: Client, fake: tuple[str, FakeLaunchService], nbytes: int
) -> None:
    data = np.random.default_rng(nbytes).random(nbytes // 4, dtype=np.float32)
    buffer = client.buffer(data)
    assert buffer.nbytes == data.nbytes and buffer.dtype == np.float32
    sizes = fake[1].state.write_chunk_sizes
    assert max(sizes, default=0) <= 1 << 20
    assert sum(sizes) == data.nbytes
    np.testing.assert_array_equal(buffer.read(), data)
    assert fake[1].state.read_chunk_size == 1 << 20 or data.nbytes == 0


def test_buffer_larger_than_the_message_limit(client: Client) -> None:
    data = np.arange(3 << 20, dtype=np.uint32)  # 12 MiB, three times gRPC's default limit
    with client.buffer(data) as buffer:
        np.testing.assert_array_equal(buffer.read(), data)
        np.testing.assert_array_equal(buffer.read(count=5, offset=8), data[2:7])
        np.testing.assert_array_equal(buffer.read(np.uint8, count=4), data[:1].view(np.uint8))


def test_write_at_offset_and_custom_chunk(
    client: Client, fake: tuple[str, FakeLaunchService]
) -> None:
    buffer = client.empty(10, np.float32)
    buffer.write(np.zeros(10, np.float32))
    buffer.write(np.array([1, 2, 3], np.float32), offset=8, chunk_size=4)
    assert fake[1].state.write_chunk_sizes[-3:] == [4, 4, 4]
    np.testing.assert_array_equal(buffer.read(), [0, 0, 1, 2, 3, 0, 0, 0, 0, 0])


def test_write_refuses_other_dtype_and_out_of_range(client: Client) -> None:
    buffer = client.empty(4, np.float32)
    with pytest.raises(errors.InvalidArgument) as caught:
        buffer.write(np.zeros(4, np.float64))
    assert caught.value.fields == ("data",)
    with pytest.raises(errors.InvalidArgument):
        buffer.write(np.zeros(4, np.float32), offset=4)
    with pytest.raises(errors.InvalidArgument):
        buffer.read(count=5)


def test_free_is_idempotent_and_then_not_found(
    client: Client, fake: tuple[str, FakeLaunchService]
) -> None:
    buffer = client.buffer(np.ones(3, np.float32))
    buffer_id = buffer.id
    buffer.free()
    buffer.close()
    assert buffer_id not in fake[1].state.buffers
    assert buffer.closed


def test_session_launch_with_typed_scalars(
    client: Client, fake: tuple[str, FakeLaunchService]
) -> None:
    x = np.arange(1, 9, dtype=np.float32)
    with client.load("accy.kernel.device_scan") as session:
        assert session.info.runtime_scalars[0].dtype == np.uint32
        assert session.allocate_intermediates(n=8) == 256
        xb, yb = client.buffer(x), client.empty(8, "f32")
        launch = session.launch([xb], [yb], n=8)
        assert launch.completed
        request = fake[1].state.launches[-1]
        assert request.runtime_scalars["n"].WhichOneof("value") == "u32"
        assert list(request.operands) == [xb.id] and list(request.results) == [yb.id]
        np.testing.assert_array_equal(yb.read(), np.cumsum(x))
        later = session.launch([xb], [yb], wait=False, n=np.uint32(8))
        assert not later.completed
        assert later.wait() is later and later.completed
        session.wait()
    session.release()  # idempotent after the with block


def test_scalars_are_checked_locally(client: Client) -> None:
    session = client.load("accy.kernel.device_scan")
    with pytest.raises(errors.InvalidArgument) as caught:
        session.launch([], [], n=1.5)
    assert caught.value.fields == ("runtime_scalars[n]",)
    with pytest.raises(errors.InvalidArgument, match="no such scalar"):
        session.launch([], [], m=1)
    with pytest.raises(errors.InvalidArgument, match="does not fit"):
        session.launch([], [], n=-1)


def test_daemon_errors_arrive_typed(client: Client) -> None:
    with pytest.raises(errors.NotFound) as caught:
        client.load("no.such.pipeline")
    assert caught.value.reason == "PIPELINE_NOT_FOUND"
    assert caught.value.domain == "accy.dev"
    assert caught.value.fields == ("target",)
    with pytest.raises(errors.ResourceExhausted) as quota:
        client.buffer(2 << 30)
    assert quota.value.quota == "device_memory"
    session = client.load("accy.kernel.device_scan")
    x = client.empty(1, np.float32)
    with pytest.raises(errors.InvalidArgument) as bounds:
        session.launch([x], [x], n=2**31)
    assert bounds.value.reason == "SCALAR_OUT_OF_BOUNDS"
    assert bounds.value.fields == ("runtime_scalars[n]",)
    session.launch([x], [x], n=1)  # the launch stream goes on after a refusal


def test_launches_share_one_stream_from_many_threads(
    client: Client, fake: tuple[str, FakeLaunchService]
) -> None:
    fake[1].rings = True
    session = client.load("accy.kernel.device_scan")
    xb, yb = client.buffer(np.ones(4, np.float32)), client.empty(4, "f32")
    with ThreadPoolExecutor(8) as pool:
        launches = list(pool.map(lambda _: session.launch([xb], [yb], n=4), range(64)))
    assert len({launch.record for launch in launches}) == 64
    assert len(set(fake[1].state.launch_ids)) == 64
    assert fake[1].state.streams == 1  # one ring over one stream, for every thread


def test_a_launch_past_its_timeout_leaves_the_stream_usable(
    client: Client, fake: tuple[str, FakeLaunchService]
) -> None:
    fake[1].rings = True
    session = client.load("accy.kernel.device_scan")
    xb, yb = client.buffer(np.ones(4, np.float32)), client.empty(4, "f32")
    fake[1].launch_delay = 0.5
    started = time.monotonic()
    with pytest.raises(errors.DeadlineExceeded, match=r"within 0\.1 s"):
        session.launch([xb], [yb], n=4, timeout=0.1)
    assert time.monotonic() - started < 0.4  # its own deadline, not the late launch's end
    fake[1].launch_delay = 0.0
    launch = session.launch([xb], [yb], n=4)  # its own record, after the late one
    assert launch.completed and len(fake[1].state.launch_ids) == 2
    assert fake[1].state.streams == 1


def test_a_unary_launch_past_its_timeout_raises_and_the_next_one_works(
    client: Client, fake: tuple[str, FakeLaunchService]
) -> None:
    session = client.load("accy.kernel.device_scan")
    xb, yb = client.buffer(np.ones(4, np.float32)), client.empty(4, "f32")
    fake[1].launch_delay = 0.5
    started = time.monotonic()
    with pytest.raises(errors.DeadlineExceeded):
        session.launch([xb], [yb], n=4, timeout=0.1)
    assert time.monotonic() - started < 0.4
    fake[1].launch_delay = 0.0
    launch = session.launch([xb], [yb], n=4)
    assert launch.id == fake[1].state.launch_ids[-1] and transport_of(client).path == "unary"


def test_run_one_call_infers_n(client: Client) -> None:
    x = np.random.default_rng(1).random(100, dtype=np.float32)
    (y,) = client.run("accy.kernel.device_scan", x)
    np.testing.assert_allclose(y, np.cumsum(x), rtol=1e-6)
    assert y.flags.writeable
    with pytest.raises(errors.InvalidArgument, match="float64"):
        client.run("accy.kernel.device_scan", x.astype(np.float64))
    with pytest.raises(errors.InvalidArgument, match="operands"):
        client.run("accy.kernel.device_scan")
    buffer = client.buffer(x)
    with pytest.raises(errors.InvalidArgument, match=r"is a Buffer .*buffer.read\(\)"):
        client.run("accy.kernel.device_scan", buffer)  # not 'operand x is object'
    with pytest.raises(errors.InvalidArgument, match="is a dict, not an array of numbers"):
        client.run("accy.kernel.device_scan", {"x": x})


def test_pipelines_and_status(client: Client) -> None:
    (info,) = client.pipelines()
    assert info.signature() == "x: f32[n] -> y: f32[n]; n: u32 1..1073741824"
    assert info.to_dict()["runtime_scalars"][0]["dtype"] == "u32"
    scan = client.pipeline("accy.kernel.device_scan", 1)
    assert (scan.target, scan.version) == ("accy.kernel.device_scan", 1)
    assert scan == client.pipeline("accy.kernel.device_scan")  # version 0: the newest
    assert [b.name for b in scan.operands] == ["x"] and scan.scalar("n").dtype == np.uint32
    with pytest.raises(errors.NotFound):
        client.pipeline("accy.kernel.device_scan", 7)
    kept = client.empty(4, np.uint8)  # held: a dropped buffer is freed by its safety net
    status = client.status()
    assert status.serving and status.my_buffers == 1
    kept.close()


def test_unreachable_daemon_names_the_target(tmp_path: object) -> None:
    target = "unix:/nonexistent/accy/none.sock"
    with pytest.raises(errors.DaemonUnreachable) as caught:
        Client(target, attach_timeout=5)
    assert target in str(caught.value) and "accyd serve" in str(caught.value)
    assert caught.value.code.name == "UNAVAILABLE"


def test_target_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    from accy.client import resolve_target

    monkeypatch.setenv("ACCY_TARGET", "unix:/env/s.sock")
    assert resolve_target("host:1234") == "host:1234"
    assert resolve_target(None) == "unix:/env/s.sock"
    assert resolve_target("/abs/s.sock") == "unix:/abs/s.sock"
    monkeypatch.delenv("ACCY_TARGET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert resolve_target() == "unix:/run/user/7/accy/accyd.sock"
