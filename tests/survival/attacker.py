"""A hostile tenant within its quotas, as a program: one attack until the time is up.

    python tests/survival/attacker.py MODE UNIX_TARGET TCP_TARGET TOKEN SECONDS

Modes (each refused request is expected and ignored; a quota refusal makes it
back off briefly, then try again):

- ``copies``: clients launch 1.5 s kernels and write their results at once
  (ring copies and gRPC writes that must wait for the kernels);
- ``segments``: tiny segments opened and never taken;
- ``clients``: as many clients as the tenant may attach, each with rings offered;
- ``flood``: refused ring records as fast as a ring takes them;
- ``slowloris``: connections to the handoff socket that trickle their hello;
- ``streams``: RingStream frames of refused records and of valid launches (TCP);
- ``kserve``: the KServe door over TCP: shapes of 60,000 dims, 32 streams of 16 requests,
  streams whose 4 MiB answers are never read, 48 MiB requests, repository listings.

Prints one JSON line of counts at the end and exits 0 (a crash exits 1).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from accy import Client, errors
from accy._ring import Ring
from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accyd.doors.kserve.protocol import open_inference_pb2 as kpb
from accyd.doors.kserve.protocol import open_inference_pb2_grpc

SLOW = "accy.test.slow"
SAXPY = "accy.kernel.saxpy"
counts: Counter[str] = Counter()
lock = threading.Lock()


def count(what: str, n: int = 1) -> None:
    with lock:
        counts[what] += n


class Raw:
    """A client of the launch service over ``target`` with a token, attached."""

    def __init__(self, target: str, token: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = launch_pb2_grpc.LaunchServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.token = token
        self.stream = self.stub.Attach(pb.AttachRequest(client_name="attacker"), metadata=self.auth)
        self.client_id = next(self.stream).attached.client_id

    @property
    def auth(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (*self.auth, ("accy-client-id", self.client_id))

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


def until(stop: float) -> Iterator[None]:
    while time.monotonic() < stop:
        yield


def refused(error: grpc.RpcError) -> None:
    count(f"refused {error.code().name}")
    if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        time.sleep(0.05)


def copies(unix: str, tcp: str, token: str, stop: float) -> None:
    def one(shared_memory: bool) -> None:
        for _ in until(stop):  # the tenant's own other attacks may hold its quotas a while
            try:
                with Client(unix, token=token, shared_memory=shared_memory) as client:
                    session = client.load(SLOW, version=1)
                    x, y = (client.empty(1 << 18, np.float32) for _ in range(2))
                    data = np.ones(1 << 18, np.float32)
                    for _ in until(stop):
                        session.launch(operands=[x], results=[y], n=256, ms=1500, wait=False)
                        y.write(data)  # waits for the kernel that writes y
                        count("copies")
            except errors.ResourceExhausted:
                count("refused RESOURCE_EXHAUSTED")
                time.sleep(0.2)

    run_threads([lambda: one(True), lambda: one(True), lambda: one(False), lambda: one(False)])


def segments(unix: str, tcp: str, token: str, stop: float) -> None:
    raw = Raw(unix, token)
    try:
        for _ in until(stop):
            try:
                raw.stub.OpenSegment(pb.OpenSegmentRequest(byte_size=4096), metadata=raw.metadata)
                count("segments offered")
            except grpc.RpcError as error:
                refused(error)
    finally:
        raw.close()


def clients(unix: str, tcp: str, token: str, stop: float) -> None:
    held: list[Raw] = []
    try:
        for _ in until(stop):
            try:
                raw = Raw(unix, token)
            except grpc.RpcError as error:
                refused(error)
                continue
            held.append(raw)
            count("clients")
            for _ring in range(8):
                try:
                    raw.stub.OpenRing(pb.OpenRingRequest(slots=4096), metadata=raw.metadata)
                    count("rings offered")
                except grpc.RpcError as error:
                    refused(error)
                    break
            if len(held) > 64:
                held.pop(0).close()
    finally:
        for raw in held:
            raw.close()


def flood(unix: str, tcp: str, token: str, stop: float) -> None:
    raw = Raw(unix, token)
    try:
        while True:  # the other attacks may hold the tenant's descriptors for a while
            try:
                offer = raw.stub.OpenRing(pb.OpenRingRequest(slots=4096), metadata=raw.metadata)
                break
            except grpc.RpcError as error:
                if time.monotonic() > stop:
                    return
                refused(error)
        handoff = Path(unix.removeprefix("unix:")).with_name(offer.handoff_name)
        ring = Ring.connect(handoff, offer.ring_id, offer.ticket)
        scalar = np.zeros(1, np.uint64).tobytes()
        for _ in until(stop):
            for _ in range(256):  # a launch on a session handle never bound: refused
                ring.launch(77, [], [], scalar, 1, notify=False, timeout=5.0)
            count("refused records", 256)
    finally:
        raw.close()


def slowloris(unix: str, tcp: str, token: str, stop: float) -> None:
    handoff = Path(unix.removeprefix("unix:")).with_name(
        Path(unix.removeprefix("unix:")).name + layout.HANDOFF_SUFFIX
    )

    def trickle() -> None:
        for _ in until(stop):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                try:
                    conn.connect(str(handoff))
                    count("slow connections")
                    while time.monotonic() < stop:
                        time.sleep(1.5)
                        conn.send(b"x")
                except OSError:
                    continue

    run_threads([trickle] * 40)


def streams(unix: str, tcp: str, token: str, stop: float) -> None:
    def garbage() -> None:
        raw = Raw(tcp, token)
        try:

            def frames() -> Iterator[pb.RingFrame]:
                yield pb.RingFrame(slots=4096)
                seq = 0
                for _ in until(stop):
                    records = b"".join(
                        layout.RECORD.pack(
                            s, layout.Kind.LAUNCH, 0, 77, 0, 0, 0, *([0] * 16), b""
                        ).ljust(layout.SLOT_SIZE, b"\0")
                        for s in range(seq, seq + 4096)
                    )
                    yield pb.RingFrame(first=seq, records=records)
                    seq += 4096
                    count("refused stream records", 4096)

            with contextlib.suppress(grpc.RpcError):
                for _ in raw.stub.RingStream(frames(), metadata=raw.metadata):
                    pass
        finally:
            raw.close()

    def valid() -> None:
        with Client(tcp, token=token) as client, client.load(SAXPY) as session:
            n = 64
            x, y = client.empty(n, np.float32), client.empty(n, np.float32)
            a = 0.0
            for _ in until(stop):
                for _ in range(512):  # distinct scalars: each checked in full
                    a += 1.0
                    session.launch(operands=[x, y], results=[y], n=n, a=a, wait=False)
                session.wait()
                count("valid stream launches", 512)

    run_threads([garbage, garbage, valid])


def saxpy_request(n: int) -> kpb.ModelInferRequest:
    """A KServe request of saxpy over ``n`` floats: x = y = 1, a = 2 (answer: 3s)."""
    request = kpb.ModelInferRequest(model_name=SAXPY)
    for name in ("x", "y"):
        request.inputs.add(name=name, datatype="FP32", shape=[n])
        request.raw_input_contents.append(np.ones(n, np.float32).tobytes())
    request.parameters["a"].double_param = 2.0
    return request


def kserve_stub(tcp: str) -> tuple[grpc.Channel, Any]:
    big = 64 << 20
    options = [("grpc.max_receive_message_length", big), ("grpc.max_send_message_length", big)]
    channel = grpc.insecure_channel(tcp, options=options)
    return channel, open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]


def kserve(unix: str, tcp: str, token: str, stop: float) -> None:
    auth = (("authorization", f"Bearer {token}"),)

    def dims() -> None:
        channel, stub = kserve_stub(tcp)
        request = saxpy_request(4)
        del request.inputs[0].shape[:]
        request.inputs[0].shape.extend([1] * 60000)
        with channel:
            for _ in until(stop):
                try:
                    stub.ModelInfer(request, metadata=auth, timeout=10)
                    count("kserve many-dim requests served")  # must not happen
                except grpc.RpcError as error:
                    count(f"refused kserve many-dim: {error.code().name}")

    def busy() -> None:
        channel, stub = kserve_stub(tcp)
        request = saxpy_request(4096)
        with channel:
            for _ in until(stop):
                with contextlib.suppress(grpc.RpcError):
                    for _ in stub.ModelStreamInfer(iter([request] * 16), metadata=auth):
                        count("kserve stream answers")

    def unread() -> None:
        channel, stub = kserve_stub(tcp)
        with channel:
            call = stub.ModelStreamInfer(iter([saxpy_request(1 << 20)] * 16), metadata=auth)
            count("kserve unread streams")
            time.sleep(max(0.0, stop - time.monotonic()))  # never reads an answer
            call.cancel()

    def huge() -> None:
        channel, stub = kserve_stub(tcp)
        request = saxpy_request(4 << 20)  # 16 MiB a tensor: 32 MiB sent, 16 MiB answered
        with channel:
            for _ in until(stop):
                try:
                    stub.ModelInfer(request, metadata=auth, timeout=30)
                    count("kserve huge answers")
                except grpc.RpcError as error:
                    count(f"refused kserve huge: {error.code().name}")
                    time.sleep(0.1)

    def listings() -> None:
        channel, stub = kserve_stub(tcp)
        with channel:
            for _ in until(stop):
                stub.RepositoryIndex(kpb.RepositoryIndexRequest(), metadata=auth, timeout=10)
                count("kserve listings")

    run_threads([dims, listings, *[busy] * 32, *[unread] * 8, *[huge] * 4])


def run_threads(targets: list[Callable[[], None]]) -> None:
    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except Exception as error:  # a refusal that ends this part: the others go on
            count(f"ended by {type(error).__name__}: {str(error)[:160]}")

    threads = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


MODES: dict[str, Callable[[str, str, str, float], None]] = {
    "copies": copies,
    "segments": segments,
    "clients": clients,
    "flood": flood,
    "slowloris": slowloris,
    "streams": streams,
    "kserve": kserve,
}


def main(argv: list[str]) -> int:
    mode, unix, tcp, token, seconds = argv
    stop = time.monotonic() + float(seconds)
    run_threads([lambda: MODES[mode](unix, tcp, token, stop)])
    result: dict[str, Any] = {"mode": mode, **counts}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
