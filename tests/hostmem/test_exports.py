"""Exported buffers end to end on the host backend: mapped with no copy, ordered after the
daemon's work, owned by one client, refused clearly, and leaving nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accy import Client, ExportedBuffer, _handoff
from accy.errors import FailedPrecondition, InvalidArgument, NotFound
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.testing import RunningDaemon, call, running_daemon
from tests.hostmem.test_shared_buffers import daemon_fds, server_pid

SAXPY = "accy.kernel.saxpy"
N = 1 << 16
GRANULE = 2 << 20


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="host", tcp=True) as running:
        yield running
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


def daemon_buffer_maps(pid: int) -> int:
    return Path(f"/proc/{pid}/maps").read_text().count("accy-buffer")


def test_an_exported_result_is_read_and_written_with_no_copy(daemon: RunningDaemon) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(N).astype(np.float32)
    y = rng.standard_normal(N).astype(np.float32)
    with Client(daemon.unix_target) as client, client.load(SAXPY) as session:
        bx, by = client.buffer(x), client.buffer(y)
        out = client.empty(N, np.float32, exportable=True)
        session.launch(operands=[bx, by], results=[out], n=N, a=3.0, wait=False)
        with out.export() as view:  # answered once the launch before it is over
            assert isinstance(view, ExportedBuffer)
            assert (view.nbytes, view.dtype, view.shape, view.is_cuda) == (
                4 * N,
                np.dtype(np.float32),
                (N,),
                False,
            )
            got = np.from_dlpack(view)
            np.testing.assert_allclose(got, np.float32(3.0) * x + y, rtol=1e-6)
            assert not hasattr(view, "__cuda_array_interface__")
            # The same pages as the daemon's: a write here is what the next launch reads.
            array = view.numpy()
            array[:] = 1.0
            session.launch(operands=[out, by], results=[bx], n=N, a=2.0)
            np.testing.assert_allclose(bx.read(), np.float32(2.0) + y, rtol=1e-6)
            # A later launch is seen by an export made after it (the same memory).
            session.launch(operands=[bx, by], results=[out], n=N, a=0.0)
            again = out.export()
            np.testing.assert_array_equal(again.numpy(), y)
            np.testing.assert_array_equal(array, y)
            again.close()
        with pytest.raises(FailedPrecondition, match="export it again"):
            view.numpy()
        view.close()  # idempotent
        np.testing.assert_array_equal(got, y)  # the DLPack array keeps the mapping


def test_exportable_buffers_are_charged_in_whole_granules(daemon: RunningDaemon) -> None:
    with Client(daemon.unix_target) as client:
        assert client.status().my_memory_in_use == 0
        plain = client.empty(1000, np.float32)
        exportable = client.empty(1000, np.float32, exportable=True)
        assert client.status().my_memory_in_use == 4000 + GRANULE
        exportable.free()
        assert client.status().my_memory_in_use == 4000
        plain.free()
        assert client.status().my_memory_in_use == 0


def test_refusals_say_what_to_fix(daemon: RunningDaemon) -> None:
    with Client(daemon.unix_target) as client:
        plain = client.empty(16, np.float32)
        with pytest.raises(FailedPrecondition, match="not allocated exportable") as info:
            plain.export()
        assert info.value.fields == ("buffer_id",)
        assert plain.id in info.value.message  # its buf_... id, not the backend's number
        for bad in ("", "no-such-buffer", "x" * 300, "../../etc/passwd"):
            with pytest.raises((NotFound, InvalidArgument)):
                call(client, "ExportBuffer", pb.ExportBufferRequest(buffer_id=bad))
    assert daemon.tcp_target is not None
    with Client(daemon.tcp_target) as remote:
        far = remote.empty(16, np.float32, exportable=True)
        with pytest.raises(FailedPrecondition, match="on this host"):
            far.export()
        with pytest.raises(FailedPrecondition, match="came over TCP") as refused:  # asked anyway
            call(remote, "ExportBuffer", pb.ExportBufferRequest(buffer_id=far.id))
        assert refused.value.fields == ("buffer_id",)


def test_another_client_cannot_export_or_take_a_buffer(daemon: RunningDaemon) -> None:
    with Client(daemon.unix_target) as alice, Client(daemon.unix_target) as mallory:
        mine = alice.buffer(np.arange(N, dtype=np.float32), exportable=True)
        with pytest.raises(NotFound):
            call(mallory, "ExportBuffer", pb.ExportBufferRequest(buffer_id=mine.id))
        offer = call(alice, "ExportBuffer", pb.ExportBufferRequest(buffer_id=mine.id))
        handoff = Path(daemon.unix_target.removeprefix("unix:")).with_name(offer.handoff_name)
        with pytest.raises(_handoff.HandoffRefused):  # a guessed ticket
            _handoff.take(handoff, offer.export_id, bytes(len(offer.ticket)), 1)
        # Asking again replaces the offer: the first ticket no longer works.
        second = call(alice, "ExportBuffer", pb.ExportBufferRequest(buffer_id=mine.id))
        with pytest.raises(_handoff.HandoffRefused):
            _handoff.take(handoff, offer.export_id, offer.ticket, 1)
        (fd,) = _handoff.take(handoff, second.export_id, second.ticket, 1)
        os.close(fd)
        with pytest.raises(_handoff.HandoffRefused):  # good once
            _handoff.take(handoff, second.export_id, second.ticket, 1)


def test_a_freed_buffer_stays_mapped_for_its_exporter_only(daemon: RunningDaemon) -> None:
    with Client(daemon.unix_target) as client:
        data = np.arange(N, dtype=np.float32)
        buffer = client.buffer(data, exportable=True)
        view = buffer.export()
        array = view.numpy()
        buffer.free()
        with pytest.raises(InvalidArgument, match="was freed"):
            buffer.export()
        np.testing.assert_array_equal(array, data)  # its own mapping, never reused
        fresh = client.empty(N, np.float32, exportable=True)
        with fresh.export() as other:
            assert not np.shares_memory(other.numpy(), array)
            np.testing.assert_array_equal(other.numpy(), 0)  # zeroed, not the freed data


VICTIM = textwrap.dedent(
    """
    import sys
    import numpy as np
    from accy import Client
    client = Client(sys.argv[1])
    buffers = [client.empty(1 << 18, np.float32, exportable=True) for _ in range(3)]
    views = [buffer.export() for buffer in buffers]
    views[0].numpy()[:] = 7
    print("READY", flush=True)
    sys.stdin.read()
    """
)


def test_a_killed_client_leaves_no_export_behind(daemon: RunningDaemon, tmp_path: Path) -> None:
    pid = server_pid(daemon)
    with Client(daemon.unix_target) as watcher:
        baseline = watcher.status()
        fds, maps = daemon_fds(pid), daemon_buffer_maps(pid)
        script = tmp_path / "victim.py"
        script.write_text(VICTIM)
        victim = subprocess.Popen(
            [sys.executable, str(script), daemon.unix_target],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
        )
        try:
            assert victim.stdout is not None
            assert victim.stdout.readline().strip() == b"READY"
            assert daemon_buffer_maps(pid) >= maps + 3
            assert watcher.status().device_memory_in_use >= baseline.device_memory_in_use + (
                3 << 20
            )
        finally:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = watcher.status()
            if (
                daemon_buffer_maps(pid) == maps
                and daemon_fds(pid) <= fds
                and status.device_memory_in_use == baseline.device_memory_in_use
            ):
                break
            time.sleep(0.05)
        assert daemon_buffer_maps(pid) == maps, "an exported buffer is still mapped"
        assert daemon_fds(pid) <= fds, f"{daemon_fds(pid)} descriptors open, {fds} before"
        assert watcher.status().device_memory_in_use == baseline.device_memory_in_use
