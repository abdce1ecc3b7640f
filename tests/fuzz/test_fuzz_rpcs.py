"""Property-based fuzzing of every RPC against a live daemon: only documented statuses, no leaks.

One ``accyd serve`` (host backend) serves the module. A fuzzing client sends
generated requests for every method of ``accy.launch.v1.LaunchService``, mixing
its own live ids, ids it freed, another client's ids, random strings, edge
numbers, wrong dtypes, bad scalar maps, and missing or junk metadata. Every
answer must be OK or a documented refusal that carries ``google.rpc`` details
(``ErrorInfo`` of domain ``accy.dev``); never INTERNAL or UNKNOWN, never a hang.
The last test checks the daemon afterwards: health SERVING, a launch still
right, the other client's data untouched, everything freed once the fuzzing
clients detach, and that at least ``MIN_REQUESTS`` requests were sent.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accy import Client, references
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.testing import RunningDaemon, running_daemon, serving
from tests.launch_service.harness import attach, details

MIN_REQUESTS = 10_000
DEADLINE = 10.0
"""Seconds any one call may take: past it, the daemon hung on the request."""
DOCUMENTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
}
SCAN, SUM, SAXPY = "accy.kernel.device_scan", "accy.kernel.reduce_sum", "accy.kernel.saxpy"
TARGETS = [SCAN, SUM, SAXPY]
SCALAR_NAMES = ["n", "a", "m", "N", "", "n ", "runtime_scalars.n"]
EDGES = [0, 1, 2, 3, 4, 255, 256, 4095, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1]
U64_EDGES = [*EDGES, 2**63, 2**64 - 1]
SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@dataclass
class Tally:
    requests: int = 0
    by_code: dict[str, int] = field(default_factory=dict)
    tests_run: set[str] = field(default_factory=set)


TALLY = Tally()
FUZZ_TESTS = {"unary", "streams", "sequences", "attach"}


class World:
    """The fuzzing client, its live ids, the ids it freed, and another client's ids."""

    def __init__(self, daemon: RunningDaemon) -> None:
        self.daemon = daemon
        self.channel = grpc.insecure_channel(daemon.unix_target)
        self.me = attach(self.channel, "fuzzer")
        self.other = attach(self.channel, "bystander")
        self.sessions: list[str] = []
        """One entry per load not yet released (the daemon counts loads)."""
        self.target_of: dict[str, str] = {}
        self.buffers: list[str] = []
        self.stale: list[str] = []
        self.refill()
        self.other_data = np.arange(64, dtype=np.float32)
        self.other_session = self.other.LoadPipeline(pb.LoadPipelineRequest(target=SCAN)).session_id
        self.other_buffer = self.other.AllocateBuffer(
            pb.AllocateBufferRequest(byte_size=256, dtype=pb.DTYPE_F32)
        ).buffer_id
        self.other.WriteBuffer(
            iter([pb.WriteBufferChunk(buffer_id=self.other_buffer, data=self.other_data.tobytes())])
        )
        opened = pb.OpenSegmentRequest(byte_size=4096)
        self.segments = [self.me.OpenSegment(opened).segment_id]
        self.other_segment = self.other.OpenSegment(opened).segment_id

    def refill(self) -> None:
        """Keep a session of every built-in pipeline and a few buffers live."""
        live = {self.target_of[session] for session in self.sessions}
        for target in TARGETS:
            if target not in live:
                reply = self.me.LoadPipeline(pb.LoadPipelineRequest(target=target))
                self.sessions.append(reply.session_id)
                self.target_of[reply.session_id] = target
                TALLY.requests += 1
        while len(self.buffers) < 6:
            size = 4 * (64 << len(self.buffers) % 3)
            reply = self.me.AllocateBuffer(
                pb.AllocateBufferRequest(byte_size=size, dtype=pb.DTYPE_F32)
            )
            self.buffers.append(reply.buffer_id)
            TALLY.requests += 1

    def trim(self) -> None:
        """Free buffers past a few dozen, so the fuzzing does not pile memory up."""
        while len(self.buffers) > 32:
            buffer_id = self.buffers.pop(0)
            self.me.FreeBuffer(pb.FreeBufferRequest(buffer_id=buffer_id))
            self.stale.append(buffer_id)
            TALLY.requests += 1

    @property
    def client_ids(self) -> tuple[str, str]:
        return self.me.client_id, self.other.client_id

    def close(self) -> None:
        self.me.detach()
        self.other.detach()
        self.channel.close()


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="host", tcp=False) as running:
        yield running
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


@pytest.fixture(scope="module")
def world(daemon: RunningDaemon) -> Iterator[World]:
    made = World(daemon)
    yield made
    made.close()


# -- strategies ----------------------------------------------------------------------------

texts = st.text(max_size=12) | st.text(min_size=250, max_size=300) | st.just("")
u32s = st.sampled_from([e for e in EDGES if e < 2**32]) | st.integers(0, 2**32 - 1)
u64s = st.sampled_from(U64_EDGES) | st.integers(0, 2**64 - 1)
small = st.integers(0, 4096)
byte_sizes = small | st.sampled_from([2**48, 2**62, 2**63 - 257, 2**63, 2**64 - 1])
"""Sizes that fit easily or never can: the host backend zeroes what it allocates."""
dtypes = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7]) | st.integers(-5, 40)
floats = st.floats(allow_nan=True, allow_infinity=True, width=32)


def scalar() -> st.SearchStrategy[pb.Scalar]:
    return st.one_of(
        st.just(pb.Scalar()),
        st.builds(lambda v: pb.Scalar(u32=v), u32s | st.integers(1, 64)),
        st.builds(lambda v: pb.Scalar(i32=v), st.integers(-(2**31), 2**31 - 1)),
        st.builds(lambda v: pb.Scalar(f32=v), floats),
        st.builds(lambda v: pb.Scalar(f64=v), st.floats()),
        st.builds(lambda v: pb.Scalar(u64=v), u64s),
        st.builds(lambda v: pb.Scalar(i64=v), st.integers(-(2**63), 2**63 - 1)),
    )


scalar_maps = st.dictionaries(
    st.sampled_from(SCALAR_NAMES) | st.text(max_size=6), scalar(), max_size=4
)


def metadata(world: World) -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    me = ("accy-client-id", world.me.client_id)
    junk_value = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=300)
    extra = st.sampled_from(
        [(), (("authorization", "Bearer nonsense"),), (("authorization", "Basic x"),)]
    )
    choice = st.one_of(
        st.just((me,)),
        st.just((me,)),
        st.just(()),
        st.builds(lambda v: (("accy-client-id", v),), junk_value),
        st.just((("accy-client-id", ""),)),
        st.just((("accy-client-id", "x" * 300),)),
        st.just((me, ("accy-client-id", "cli_junk"))),
    )
    return st.builds(lambda m, e: (*m, *e), choice, extra)


def ids(pool: Callable[[], list[str]], world: World, other: str) -> st.SearchStrategy[str]:
    """Ids of the kind ``pool`` holds: live ones (most often), freed, another's, junk.

    What is drawn is a kind and an index, never the changing pool itself, so that
    hypothesis sees the same draws when it replays an example.
    """

    def resolve(kind: str, index: int, junk: str) -> str:
        values = {
            "live": pool(),
            "stale": world.stale,
            "other": [other],
            "client": list(world.client_ids),
        }.get(kind)
        return values[index % len(values)] if values else junk

    kinds = st.sampled_from(["live", "live", "live", "other", "stale", "client", "junk"])
    return st.builds(resolve, kinds, st.integers(0, 1000), texts)


# -- requests for every RPC ------------------------------------------------------------------


@dataclass
class Request:
    method: str
    message: Any
    metadata: tuple[tuple[str, str], ...]


@functools.cache
def unary_requests(world: World) -> st.SearchStrategy[Request]:
    session = ids(lambda: world.sessions, world, world.other_session)
    buffer = ids(lambda: world.buffers, world, world.other_buffer)
    buffer_lists = st.lists(buffer, max_size=3)
    segment = ids(lambda: world.segments, world, world.other_segment)
    md = metadata(world)
    targets = st.sampled_from([*TARGETS, "accy.test.fault", "no.such"]) | texts
    formats = st.sampled_from(["", "host_py", "cuda_cpp", "ptx", "cubin", "zig"]) | texts
    tensors = st.builds(
        lambda name, dtype, data: pb.Tensor(name=name, dtype=dtype, data=data),
        st.sampled_from(["", "x", "y", "z"]) | texts,
        dtypes,
        st.binary(max_size=64),
    )

    def request(method: str, message: st.SearchStrategy[Any]) -> st.SearchStrategy[Request]:
        return st.builds(Request, st.just(method), message, md)

    return st.one_of(
        request("ListPipelines", st.just(pb.ListPipelinesRequest())),
        request("GetStatus", st.just(pb.GetStatusRequest())),
        request(
            "LoadPipeline",
            st.builds(
                lambda t, v, f, d: pb.LoadPipelineRequest(target=t, version=v, format=f, device=d),
                targets,
                st.sampled_from([0, 1, 2]) | u32s,
                formats,
                st.sampled_from([0, 0, 1]) | u32s,
            ),
        ),
        request(
            "AllocateIntermediates",
            st.builds(
                lambda s, m: pb.AllocateIntermediatesRequest(session_id=s, runtime_scalars=m),
                session,
                scalar_maps,
            ),
        ),
        request(
            "Launch",
            st.builds(
                lambda s, o, r, m, w: pb.LaunchRequest(
                    session_id=s, operands=o, results=r, runtime_scalars=m, wait=w
                ),
                session,
                buffer_lists,
                buffer_lists,
                scalar_maps,
                st.booleans(),
            ),
        ),
        request(
            "WaitLaunch",
            st.builds(
                lambda s, launch: pb.WaitLaunchRequest(session_id=s, launch_id=launch),
                session,
                st.just("") | texts | st.builds(lambda i: f"lau_{i}", st.integers(0, 9)),
            ),
        ),
        request("Release", st.builds(lambda s: pb.ReleaseRequest(session_id=s), session)),
        request(
            "AllocateBuffer",
            st.builds(
                lambda b, d, dev, x: pb.AllocateBufferRequest(
                    byte_size=b, dtype=d, device=dev, exportable=x
                ),
                byte_sizes,
                dtypes,
                st.sampled_from([0, 0, 1]) | u32s,
                st.booleans(),
            ),
        ),
        request("ExportBuffer", st.builds(lambda b: pb.ExportBufferRequest(buffer_id=b), buffer)),
        request("FreeBuffer", st.builds(lambda b: pb.FreeBufferRequest(buffer_id=b), buffer)),
        request(
            "OpenSegment",
            st.builds(
                lambda b, dev: pb.OpenSegmentRequest(byte_size=b, device=dev),
                st.sampled_from([0, 1, 4096, 1 << 20, 1 << 41, 2**64 - 1]),
                st.sampled_from([0, 0, 1]) | u32s,
            ),
        ),
        request(
            "CopySegment",
            st.builds(
                lambda g, go, b, bo, n, d: pb.CopySegmentRequest(
                    segment_id=g,
                    segment_offset=go,
                    buffer_id=b,
                    buffer_offset=bo,
                    size=n,
                    direction=d,
                ),
                segment,
                small | u64s,
                buffer,
                small | u64s,
                small | u64s,
                st.sampled_from([0, 1, 2]) | st.integers(-3, 9),
            ),
        ),
        request("CloseSegment", st.builds(lambda g: pb.CloseSegmentRequest(segment_id=g), segment)),
        request(
            "Run",
            st.builds(
                lambda t, v, f, o, m: pb.RunRequest(
                    target=t, version=v, format=f, operands=o, runtime_scalars=m
                ),
                targets,
                st.sampled_from([0, 1]) | u32s,
                formats,
                st.lists(tensors, max_size=3),
                scalar_maps,
            ),
        ),
    )


@functools.cache
def write_requests(world: World) -> st.SearchStrategy[Request]:
    buffer = ids(lambda: world.buffers, world, world.other_buffer)
    chunk = st.builds(
        lambda b, o, d: pb.WriteBufferChunk(buffer_id=b, offset=o, data=d),
        buffer | st.just(""),
        small | u64s,
        st.binary(max_size=300),
    )
    return st.builds(Request, st.just("WriteBuffer"), st.lists(chunk, max_size=4), metadata(world))


@functools.cache
def read_requests(world: World) -> st.SearchStrategy[Request]:
    buffer = ids(lambda: world.buffers, world, world.other_buffer)
    message = st.builds(
        lambda b, o, s, c: pb.ReadBufferRequest(buffer_id=b, offset=o, size=s, chunk_size=c),
        buffer,
        small | u64s,
        small | u64s,
        st.sampled_from([0, 0, 16, 256, 4096]) | st.integers(64, 2**32 - 1),
    )
    return st.builds(Request, st.just("ReadBuffer"), message, metadata(world))


@functools.cache
def attach_requests(world: World) -> st.SearchStrategy[Request]:
    message = st.builds(lambda name: pb.AttachRequest(client_name=name), texts)
    return st.builds(Request, st.just("Attach"), message, metadata(world))


# -- sending and judging ---------------------------------------------------------------------


def daemon_log(daemon: RunningDaemon, request_id: str) -> str:
    """The daemon's log from the first line that names ``request_id`` (its traceback)."""
    text = daemon.log.read_text(errors="replace")
    start = text.find(request_id) if request_id else -1
    return text[max(start - 200, 0) : start + 3000] if start >= 0 else text[-3000:]


def judge(world: World, request: Request, error: grpc.RpcError) -> None:
    code = error.code()
    if code not in DOCUMENTED:
        info = (
            details(error).get("RequestInfo") if code != grpc.StatusCode.DEADLINE_EXCEEDED else None
        )
        raise AssertionError(
            f"{request.method} answered {code.name}: {error.details()}\n"
            f"request: {request.message!r}\nmetadata: {request.metadata!r}\n"
            f"daemon log:\n{daemon_log(world.daemon, info.request_id if info else '')}"
        )
    found = details(error)
    info = found.get("ErrorInfo")
    assert info is not None and info.domain == "accy.dev" and info.reason, (
        f"{request.method} {code.name} without ErrorInfo: {found}"
    )


def send(world: World, request: Request) -> Any:
    """Send one request; returns the reply (``None`` if refused, after judging the refusal)."""
    stub, md = world.me.stub, request.metadata
    TALLY.requests += 1
    try:
        if request.method == "WriteBuffer":
            reply = stub.WriteBuffer(iter(request.message), metadata=md, timeout=DEADLINE)
        elif request.method == "ReadBuffer":
            reply = list(stub.ReadBuffer(request.message, metadata=md, timeout=DEADLINE))
        elif request.method == "Attach":
            call = stub.Attach(request.message, metadata=md, timeout=DEADLINE)
            try:
                reply = next(call)
                assert reply.attached.client_id, reply
            finally:
                call.cancel()
        else:
            reply = getattr(stub, request.method)(request.message, metadata=md, timeout=DEADLINE)
    except grpc.RpcError as error:
        name = error.code().name
        TALLY.by_code[name] = TALLY.by_code.get(name, 0) + 1
        judge(world, request, error)
        return None
    TALLY.by_code["OK"] = TALLY.by_code.get("OK", 0) + 1
    mine = request.metadata[:1] == (("accy-client-id", world.me.client_id),)
    if mine:
        note(world, request, reply)
    return reply


def note(world: World, request: Request, reply: Any) -> None:
    """Keep the fuzzing client's pool of live ids current."""
    if request.method == "AllocateBuffer":
        world.buffers.append(reply.buffer_id)
        world.trim()
    elif request.method == "LoadPipeline":
        world.sessions.append(reply.session_id)
        world.target_of[reply.session_id] = reply.pipeline.target
    elif request.method == "OpenSegment":
        world.segments.append(reply.segment_id)
    elif request.method == "CloseSegment":
        world.segments.remove(request.message.segment_id)
    elif request.method == "FreeBuffer":
        world.buffers.remove(request.message.buffer_id)
        world.stale.append(request.message.buffer_id)
        world.refill()
    elif request.method == "Release":
        world.sessions.remove(request.message.session_id)  # one load
        if request.message.session_id not in world.sessions:  # the last: freed
            world.stale.append(request.message.session_id)
        world.refill()


# -- the tests -------------------------------------------------------------------------------


@settings(SETTINGS, max_examples=6000)
@given(data=st.data())
def test_unary_rpcs_answer_only_documented_statuses(world: World, data: st.DataObject) -> None:
    TALLY.tests_run.add("unary")
    send(world, data.draw(unary_requests(world)))


@settings(SETTINGS, max_examples=2600)
@given(data=st.data())
def test_buffer_streams_answer_only_documented_statuses(world: World, data: st.DataObject) -> None:
    TALLY.tests_run.add("streams")
    send(world, data.draw(st.one_of(write_requests(world), read_requests(world))))


@settings(SETTINGS, max_examples=400)
@given(data=st.data())
def test_attach_answers_only_documented_statuses(world: World, data: st.DataObject) -> None:
    TALLY.tests_run.add("attach")
    send(world, data.draw(attach_requests(world)))


@settings(SETTINGS, max_examples=600)
@given(data=st.data())
def test_sequences_of_mixed_requests(world: World, data: st.DataObject) -> None:
    """A few requests in a row, so one request's effects meet the next."""
    TALLY.tests_run.add("sequences")
    every = st.one_of(
        unary_requests(world), write_requests(world), read_requests(world), attach_requests(world)
    )
    for request in data.draw(st.lists(every, min_size=2, max_size=5)):
        send(world, request)


def test_the_daemon_is_healthy_correct_and_holds_nothing_after(
    daemon: RunningDaemon, world: World
) -> None:
    target = daemon.unix_target
    assert serving(target), "health is not SERVING after the fuzzing"
    other = world.other
    read = list(other.ReadBuffer(pb.ReadBufferRequest(buffer_id=world.other_buffer)))
    got = np.frombuffer(b"".join(chunk.data for chunk in read), np.float32)
    np.testing.assert_array_equal(got, world.other_data)  # nothing reached the bystander's data
    x = np.random.default_rng(3).random(10_000, dtype=np.float32)
    with Client(target) as client:
        (y,) = client.run(SCAN, x)
    reference = references.find(SCAN)
    assert reference is not None
    assert all(c.ok for c in references.compare(reference, [x], [y], {"n": x.size}))
    world.close()
    expected = {"clients": 1, "sessions": 0, "buffers": 0, "device_memory_in_use": 0}
    with Client(target) as fresh:

        def held() -> dict[str, int]:
            status = fresh.status()
            return {key: int(getattr(status, key)) for key in expected}

        assert _eventually(lambda: held() == expected, 10.0), f"left behind: {held()}"
    print(f"\nfuzz: {TALLY.requests} requests, answers by code {TALLY.by_code}")
    if TALLY.tests_run >= FUZZ_TESTS:
        assert TALLY.requests >= MIN_REQUESTS, TALLY.requests


def _eventually(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
