"""A client process that makes resources, starts a long operation, says READY and waits to die.

Run as ``python tests/survival/victim.py MODE TARGET``; the test kills it with
SIGKILL while the operation is in flight. It speaks the raw protocol (no client
library), so what is in flight is exactly what the mode says:

- ``write``: a WriteBuffer stream that never ends (chunks cycle over a 16 MiB buffer);
- ``read``: a ReadBuffer of 16 MiB in 64 KiB chunks, consumed slowly;
- ``launch``: device_scan launches on 1 Mi elements enqueued without waiting, forever
  (at most eight in flight, the oldest waited for);
- ``wait``: launches enqueued, then a WaitLaunch blocking on all of them;
- ``mixed``: launches enqueued without waiting, then a never-ending WriteBuffer stream;
- ``flood``: 1,000 launches of ``accy.test.slow`` (200 ms each, from the test catalog
  ``tests/catalogs/slow``) enqueued without waiting, then nothing;
- ``freeze``: a ReadBuffer of 256 MiB, left open: after the first chunk the process
  stops itself (SIGSTOP), so the daemon's writes to it block once the socket is full.

Every mode first loads a second session (saxpy) and allocates a few small buffers,
so there is more to free than the operation itself uses.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np

from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc

SCAN, SAXPY = "accy.kernel.device_scan", "accy.kernel.saxpy"
SLOW, SLOW_N = "accy.test.slow", 1024
BIG = 16 << 20
HUGE = 256 << 20
FLOOD = 1000
N = 1 << 20
CHUNK = 64 << 10
LIVENESS = int(os.environ.get("ACCY_VICTIM_LIVENESS", "2"))
"""Seconds of silence after which the daemon detaches this client (it pings four times as
often); a test about killed clients, not silent ones, gives more so a loaded machine's late
ping does not detach a victim before it is killed."""


def ready() -> None:
    print("READY", flush=True)


class Victim:
    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = launch_pb2_grpc.LaunchServiceStub(self.channel)  # type: ignore[no-untyped-call]
        request = pb.AttachRequest(client_name="victim", liveness_seconds=LIVENESS)
        self.stream = self.stub.Attach(request)
        first = next(self.stream)
        self.metadata = (("accy-client-id", first.attached.client_id),)
        threading.Thread(target=self.keep_alive, daemon=True).start()

    def keep_alive(self) -> None:
        """Ping as a live client does; a SIGSTOP stops this with the rest of the process."""
        while True:
            time.sleep(LIVENESS / 4)
            self.stub.Ping(pb.PingRequest(), metadata=self.metadata)

    def buffer(self, nbytes: int) -> str:
        request = pb.AllocateBufferRequest(byte_size=nbytes, dtype=pb.DTYPE_F32)
        return str(self.stub.AllocateBuffer(request, metadata=self.metadata).buffer_id)

    def load(self, target: str) -> str:
        request = pb.LoadPipelineRequest(target=target)
        return str(self.stub.LoadPipeline(request, metadata=self.metadata).session_id)

    def extras(self) -> None:
        self.load(SAXPY)
        for size in (4096, 65536, 1 << 20):
            self.buffer(size)

    def endless_write(self, buffer_id: str) -> None:
        data = np.random.default_rng().integers(0, 255, CHUNK, dtype=np.uint8).tobytes()

        def chunks() -> Iterator[pb.WriteBufferChunk]:
            for index in itertools.count():
                offset = (index * CHUNK) % BIG
                yield pb.WriteBufferChunk(buffer_id=buffer_id, offset=offset, data=data)
                if index == 4:
                    ready()

        self.stub.WriteBuffer(chunks(), metadata=self.metadata)

    def slow_read(self, buffer_id: str) -> None:
        request = pb.ReadBufferRequest(buffer_id=buffer_id, chunk_size=CHUNK)
        for index, _ in enumerate(self.stub.ReadBuffer(request, metadata=self.metadata)):
            if index == 1:
                ready()
            time.sleep(0.01)

    def frozen_read(self, buffer_id: str) -> None:
        request = pb.ReadBufferRequest(buffer_id=buffer_id)
        for _ in self.stub.ReadBuffer(request, metadata=self.metadata):
            ready()
            os.kill(os.getpid(), signal.SIGSTOP)

    def enqueue(self, session: str, x: str, y: str) -> str:
        request = pb.LaunchRequest(
            session_id=session,
            operands=[x],
            results=[y],
            runtime_scalars={"n": pb.Scalar(u32=N)},
            wait=False,
        )
        return str(self.stub.Launch(request, metadata=self.metadata).launch_id)

    def flood(self) -> None:
        session = self.load(SLOW)
        x, y = self.buffer(4 * SLOW_N), self.buffer(4 * SLOW_N)
        scalars = {"n": pb.Scalar(u32=SLOW_N), "ms": pb.Scalar(u32=200)}
        request = pb.LaunchRequest(
            session_id=session, operands=[x], results=[y], runtime_scalars=scalars, wait=False
        )
        for _ in range(FLOOD):
            self.stub.Launch(request, metadata=self.metadata)
        ready()

    def scan_session(self) -> tuple[str, str, str]:
        session = self.load(SCAN)
        x, y = self.buffer(4 * N), self.buffer(4 * N)
        request = pb.AllocateIntermediatesRequest(
            session_id=session, runtime_scalars={"n": pb.Scalar(u32=N)}
        )
        self.stub.AllocateIntermediates(request, metadata=self.metadata)
        return session, x, y

    def run(self, mode: str) -> None:
        self.extras()
        if mode == "write":
            self.endless_write(self.buffer(BIG))
        elif mode == "read":
            self.slow_read(self.buffer(BIG))
        elif mode == "freeze":
            self.frozen_read(self.buffer(HUGE))
        elif mode == "flood":
            self.flood()
        elif mode in ("launch", "wait", "mixed"):
            session, x, y = self.scan_session()
            launches = [self.enqueue(session, x, y) for _ in range(4)]
            if mode == "mixed":
                self.endless_write(self.buffer(BIG))
            elif mode == "wait":
                ready()
                wait = pb.WaitLaunchRequest(session_id=session)
                self.stub.WaitLaunch(wait, metadata=self.metadata)
            else:
                ready()
                for count in itertools.count():
                    launches.append(self.enqueue(session, x, y))
                    if count % 4 == 3:
                        oldest = pb.WaitLaunchRequest(session_id=session, launch_id=launches[-8])
                        self.stub.WaitLaunch(oldest, metadata=self.metadata)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        time.sleep(3600)  # the operation ended before the kill: hold on to everything


if __name__ == "__main__":
    Victim(sys.argv[2]).run(sys.argv[1])
