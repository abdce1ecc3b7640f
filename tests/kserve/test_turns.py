"""A tenant's share of the KServe door: its inferences at once across every stream and call."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from accyd.catalog import load_catalog
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.protocol import open_inference_pb2_grpc
from accyd.doors.kserve.turns import TENANT_IN_FLIGHT, TENANT_STREAMS, TenantTurns
from accyd.errors import QuotaExceeded
from tests.launch_service.harness import ServerThread, make_config
from tests.waiting import eventually

SLOW = load_catalog([Path(__file__).parents[1] / "catalogs" / "slow"])


def test_turns_bound_a_tenant_and_leave_others_alone() -> None:
    async def main() -> None:
        turns = TenantTurns(in_flight=2, streams=1)
        most = 0

        async def one(tenant: str) -> None:
            nonlocal most
            turn = await turns.acquire(tenant)
            most = max(most, turns.running("a"))
            await asyncio.sleep(0.01)
            turn.release()
            turn.release()  # once only

        await asyncio.gather(*(one("a") for _ in range(10)))
        assert most == 2
        held = [await turns.acquire("a") for _ in range(2)]  # a's turns all held
        await asyncio.wait_for(one("b"), 1.0)  # b's come at once
        waiting = asyncio.ensure_future(turns.acquire("a"))
        await asyncio.sleep(0)
        waiting.cancel()  # a wait given up takes nothing
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        for turn in held:
            turn.release()
        with (
            turns.stream("a"),
            pytest.raises(QuotaExceeded, match="1 ModelStreamInfer"),
            turns.stream("a"),
        ):
            pass
        with turns.stream("b"):  # another tenant's stream
            pass
        assert turns._tenants == {}  # nothing kept for tenants with nothing open

    asyncio.run(main())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    config = make_config(Path(tmp_path_factory.mktemp("turns")), "tcp", blocking_threads=32)
    running = ServerThread(config, catalog=SLOW)
    yield running
    running.stop()


def _slow(ms: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="accy.test.slow")
    request.inputs.add(name="x", datatype="FP32", shape=[4]).contents.fp32_contents.extend(
        [1.0] * 4
    )
    request.parameters["ms"].int64_param = ms
    return request


def test_many_streams_of_one_tenant_run_a_bounded_share_at_once(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 streams of 16 requests each once ran all 512 at once on the loop, and every other
    tenant's requests waited behind them."""
    door = server.server.kserve
    assert door is not None
    run = door._inference.run
    running = most = 0

    async def counted(*args: Any) -> pb.ModelInferResponse:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            return await run(*args)
        finally:
            running -= 1

    monkeypatch.setattr(door._inference, "run", counted)
    channel = grpc.insecure_channel(server.address)
    stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        streams = [stub.ModelStreamInfer(iter([_slow(20)] * 16)) for _ in range(32)]
        answers = [list(stream) for stream in streams]
    finally:
        channel.close()
    assert all(len(a) == 16 and not any(r.error_message for r in a) for a in answers)
    assert most == TENANT_IN_FLIGHT  # used to the full, never past it


def test_a_tenant_holds_a_bounded_number_of_streams(server: ServerThread) -> None:
    channel = grpc.insecure_channel(server.address)
    stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)
    release = threading.Event()

    def idle() -> Iterator[pb.ModelInferRequest]:
        release.wait(30)
        return
        yield

    try:
        door = server.server.kserve
        assert door is not None
        tenant = door._default.tenant
        held = [stub.ModelStreamInfer(idle()) for _ in range(TENANT_STREAMS)]
        assert eventually(lambda: door.turns.streams_of(tenant) == TENANT_STREAMS), held
        refused = stub.ModelStreamInfer(iter([_slow(0)]))
        with pytest.raises(grpc.RpcError) as error:
            list(refused)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "ModelStreamInfer streams open" in (error.value.details() or "")
    finally:
        release.set()
        channel.close()
