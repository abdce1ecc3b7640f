"""What the KServe door's requests hold of the daemon's memory: bounded, given back once sent."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from accyd.doors.kserve.held import HeldBytes
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.protocol import open_inference_pb2_grpc
from accyd.errors import QuotaExceeded
from tests.launch_service.harness import ServerThread, make_config
from tests.waiting import eventually

MiB = 1 << 20
N = MiB // 4  # a MiB of float32 per tensor: a request holds 2 * 2 + 3 * 1 = 7 MiB
LIMIT = 32 * MiB  # 16 MiB a tenant: two requests at a time, never three


def test_held_bytes_wait_in_order_and_come_back() -> None:
    async def main() -> None:
        held = HeldBytes(20)  # 10 a tenant
        first = await held.take("a", 6, "first")
        later = [asyncio.ensure_future(held.take("a", size, "later")) for size in (5, 1)]
        await asyncio.sleep(0)
        assert not any(t.done() for t in later)  # the small one waits behind the large one
        other = await asyncio.wait_for(held.take("b", 10, "another tenant's"), 1.0)
        cancelled = asyncio.ensure_future(held.take("a", 4, "cancelled"))
        await asyncio.sleep(0)
        cancelled.cancel()
        first.release()
        first.release()  # once only
        five, one = await asyncio.gather(*later)
        assert held.held == 16 and held.held_by("a") == 6
        with pytest.raises(QuotaExceeded, match="--kserve-memory-limit"):
            await held.take("a", 11, "huge")
        for hold in (five, one, other):
            hold.release()
        assert held.held == 0 and held._tenants == {}

    asyncio.run(main())


def test_a_tenant_that_fills_its_share_leaves_the_rest_to_others() -> None:
    """Never-read answers of one tenant once held the whole bound: every other tenant's
    requests waited behind them (a 10 s deadline passed)."""

    async def main() -> None:
        held = HeldBytes(100)
        hogs = [await held.take("a", 25, "hog") for _ in range(2)]  # its half, never given back
        blocked = asyncio.ensure_future(held.take("a", 1, "more of a's"))
        await asyncio.sleep(0)
        assert not blocked.done()
        mine = await asyncio.wait_for(held.take("b", 50, "b's"), 1.0)
        mine.release()
        for hog in hogs:
            hog.release()
        (await blocked).release()

    asyncio.run(main())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = Path(tmp_path_factory.mktemp("held"))
    running = ServerThread(make_config(folder, "tcp", kserve_memory_limit=LIMIT))
    yield running
    running.stop()


def _saxpy(n: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="accy.kernel.saxpy")
    for name in ("x", "y"):
        request.inputs.add(name=name, datatype="FP32", shape=[n])
        request.raw_input_contents.append(np.ones(n, np.float32).tobytes())
    request.parameters["a"].double_param = 2.0
    return request


def test_requests_hold_at_most_the_bound_and_a_larger_one_is_refused(
    server: ServerThread,
) -> None:
    door = server.server.kserve
    assert door is not None
    most = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, door.held.held)
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    channel = grpc.insecure_channel(
        server.address, options=[("grpc.max_receive_message_length", 64 * MiB)]
    )
    stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: stub.ModelInfer(_saxpy(N), timeout=30), range(16)))
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(_saxpy(3 * N), timeout=30)  # 21 MiB alone, past a tenant's half
    finally:
        done.set()
        watcher.join()
        channel.close()
    for answer in answers:
        assert np.all(np.frombuffer(answer.raw_output_contents[0], np.float32) == 3.0)
    assert 7 * MiB <= most <= LIMIT // 2  # two at a time, never three
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--kserve-memory-limit" in (refused.value.details() or "")
    assert eventually(lambda: door.held.held == 0)


def test_a_streams_requests_hold_at_most_the_bound_and_give_it_back_as_it_ends(
    server: ServerThread,
) -> None:
    """A stream's answers hold their memory until written, and whatever they hold comes
    back when the stream ends under them (100 unread answers once grew the daemon past its
    limit, with nothing counted)."""
    door = server.server.kserve
    assert door is not None
    channel = grpc.insecure_channel(server.address)
    stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)
    release = threading.Event()

    def requests() -> Iterator[pb.ModelInferRequest]:
        for _ in range(8):
            yield _saxpy(N)
        release.wait(30)

    stream = stub.ModelStreamInfer(requests())
    try:
        # Unread, the answers fill the window: at most the bound is held meanwhile.
        assert eventually(lambda: door.held.held > 0)
        time.sleep(0.5)
        assert door.held.held <= LIMIT // 2
    finally:
        release.set()
        stream.cancel()
        channel.close()
    assert eventually(lambda: door.held.held == 0)
