"""A tokens reload that removes a token ends what that token holds open, at once."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from accy import Client, errors
from accy.testing import transport_of
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.protocol import open_inference_pb2_grpc
from accyd.tokens import hash_token
from tests.kserve.harness import simple_request
from tests.launch_service.harness import ServerThread, make_config
from tests.security.harness import TokenSpec, write_tokens

WITHIN = 2.0
"""How soon after the reload a removed token's streams and client end."""
INTS = np.arange(16, dtype=np.int32)


def keep_only(path: Path, tenant: str, token: str) -> None:
    """Rewrite the tokens file with one token alone."""
    path.write_text(
        f'[[token]]\ntenant = "{tenant}"\nsha256 = "{hash_token(token)}"\nscopes = ["launch"]\n'
    )


async def clients_by_tenant(running: ServerThread) -> dict[str, int]:
    return {tenant.name: tenant.clients for tenant in running.server.daemon.status().tenants}


class Launching(threading.Thread):
    """A client of ``token`` launching on its ring stream until it fails (or is stopped)."""

    def __init__(self, address: str, token: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(address, token=token)
        self.error: errors.AccyError | None = None
        self.ended_at: float | None = None
        self.launches = 0
        self.stop = threading.Event()
        self.running = threading.Event()

    def run(self) -> None:
        try:
            with self.client.load("accy.kernel.saxpy") as saxpy:
                x = self.client.buffer(np.ones(64, np.float32))
                while not self.stop.is_set():
                    saxpy.launch(operands=[x, x], results=[x], n=64, a=0.0)
                    assert transport_of(self.client).path == "ring-stream"
                    self.launches += 1
                    self.running.set()
        except errors.AccyError as error:
            self.error, self.ended_at = error, time.monotonic()


class Streaming:
    """A ModelStreamInfer stream of ``token``, fed one request at a time."""

    def __init__(self, address: str, token: str) -> None:
        self.channel = grpc.insecure_channel(address)
        stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.outbox: queue.SimpleQueue[pb.ModelInferRequest | None] = queue.SimpleQueue()
        metadata = (("authorization", f"Bearer {token}"),)
        self.replies: Iterator[Any] = stub.ModelStreamInfer(
            iter(self.outbox.get, None), metadata=metadata
        )

    def ask(self) -> Any:
        self.outbox.put(simple_request(INTS, INTS))
        return next(self.replies)

    def close(self) -> None:
        self.outbox.put(None)
        self.channel.close()


def test_a_removed_tokens_streams_and_client_end_at_the_reload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An open RingStream ran 23,408 launches and a ModelStreamInfer 13,500 inferences in the
    32 s after their token was removed and the daemon reloaded: only new calls were refused."""
    path = tmp_path / "tokens.toml"
    specs = {"alpha": TokenSpec("alpha"), "beta": TokenSpec("beta")}
    tokens = write_tokens(path, specs)
    running = ServerThread(make_config(tmp_path, "tcp", tokens_file=path))
    revoked, kept = Launching(running.address, tokens["alpha"]), None
    streams: list[Streaming] = []
    try:
        kept = Launching(running.address, tokens["beta"])
        revoked.start(), kept.start()
        assert revoked.running.wait(30) and kept.running.wait(30)
        alpha, beta = Streaming(running.address, tokens["alpha"]), None
        streams.append(alpha)
        beta = Streaming(running.address, tokens["beta"])
        streams.append(beta)
        assert not alpha.ask().error_message and not beta.ask().error_message

        keep_only(path, "beta", tokens["beta"])  # alpha's token removed
        reloaded = time.monotonic()
        running.loop.call_soon_threadsafe(running.server.reload_tokens)

        try:
            alpha.ask()
            raise AssertionError("the removed token's stream went on")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
        revoked.join(WITHIN + 5)
        assert revoked.error is not None and revoked.ended_at is not None
        assert revoked.ended_at - reloaded < WITHIN, revoked.ended_at - reloaded
        assert time.monotonic() - reloaded < WITHIN + 1
        deadline = reloaded + WITHIN
        while (held := running.call(clients_by_tenant(running))).get("alpha"):
            assert time.monotonic() < deadline, f"alpha's clients stayed: {held}"
            time.sleep(0.05)
        launched = kept.launches
        assert not beta.ask().error_message  # the kept token's stream and client go on
        time.sleep(0.2)
        assert kept.is_alive() and kept.launches > launched
        stray = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
        assert not stray, stray  # a stream's read let go as it ended left its end to asyncio
    finally:
        for stream in streams:
            stream.close()
        revoked.stop.set()
        if kept is not None:
            kept.stop.set()
            kept.join(10)
            kept.client.close()
        revoked.join(10)
        revoked.client.close()
        running.stop()
