"""The churn's client processes: one life of one kind doing checked work until its end.

A life is one process, started by ``bench/churn.py``, of one of four kinds:

- ``ring``: an accy ``Client`` on the Unix socket; launches go through the ring
  in memory shared with the daemon, buffers through shared memory;
- ``ring_stream``: an accy ``Client`` over TCP; launches go as ring records
  carried by a ``RingStream`` call;
- ``kserve``: unary ``ModelInfer`` calls of the KServe v2 door (the generated
  stubs), on the Unix socket or over TCP;
- ``kserve_stream``: ``ModelStreamInfer`` streams of the same requests.

Every result is checked: accy work is the soak's mix (``bench/soak.py``), KServe
work is ``simple`` (exact int32 sums and differences), ``device_scan`` and
``reduce_sum`` (against the float64 references). A wrong result counts and the
life goes on; any other error ends the life and is reported. Counts are written
to memory the parent reads (``counts``: verified, wrong, errors) as they happen,
so a life the parent SIGKILLs still counts what it did; nothing here takes a
lock another process could need, since a life may die holding it.
"""

from __future__ import annotations

import itertools
import queue
import time
import traceback
from collections.abc import Callable, Iterator, MutableSequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import grpc
import numpy as np
from soak import SCAN, SUM, Mix

from accy import Client, references
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.protocol import open_inference_pb2_grpc

KINDS = ("ring", "ring_stream", "kserve", "kserve_stream")
VERIFIED, WRONG, ERRORS = 0, 1, 2
"""Slots of a life's ``counts``."""
KSERVE_MODELS = ("simple", SCAN, SUM)
MAX_N = 16_384
"""The largest ``n`` of a KServe scan or sum (64 KiB each way)."""

Counts = MutableSequence[int]
Check = Callable[["pb.ModelInferResponse"], bool]


@dataclass(frozen=True)
class Life:
    """What one process does: its kind, seed, length and the daemon's addresses."""

    kind: str
    seed: int
    seconds: float
    unix_target: str
    tcp_target: str


def live(life: Life, counts: Counts, report: Connection) -> None:
    """A process's entry: work until the life ends; send the errors (if any) and exit."""
    errors: list[str] = []
    try:
        WORK[life.kind](life, np.random.default_rng(life.seed), counts)
    except Exception as error:
        counts[ERRORS] += 1
        where = traceback.format_exc(limit=4).strip().splitlines()[-1]
        errors.append(f"{life.kind} #{life.seed}: {type(error).__name__}: {error} ({where})")
    report.send(errors)
    report.close()


def _tally(counts: Counts, ok: bool) -> None:
    counts[VERIFIED if ok else WRONG] += 1


# -- accy clients -------------------------------------------------------------------------


def _accy(target: str, life: Life, rng: np.random.Generator, counts: Counts) -> None:
    stop_at = time.monotonic() + life.seconds
    with Client(target, client_name=f"churn-{life.kind}-{life.seed}") as client:
        mix = Mix(client, rng)
        steps = [step for _, step, _ in mix.steps()]
        weights = np.array([weight for _, _, weight in mix.steps()], dtype=np.float64)
        weights /= weights.sum()
        while time.monotonic() < stop_at:
            try:
                steps[int(rng.choice(len(steps), p=weights))]()
            except AssertionError:  # the mix's word for a wrong result
                _tally(counts, False)
                continue
            _tally(counts, True)


def ring(life: Life, rng: np.random.Generator, counts: Counts) -> None:
    _accy(life.unix_target, life, rng, counts)


def ring_stream(life: Life, rng: np.random.Generator, counts: Counts) -> None:
    _accy(life.tcp_target, life, rng, counts)


# -- KServe callers -----------------------------------------------------------------------


def infer_case(rng: np.random.Generator, ident: str) -> tuple[pb.ModelInferRequest, Check]:
    """A random request of a built-in model and the check of its answer."""
    model = str(KSERVE_MODELS[int(rng.integers(len(KSERVE_MODELS)))])
    request = pb.ModelInferRequest(model_name=model, id=ident)
    if model == "simple":
        a, b = (rng.integers(-(2**31), 2**31, 16, dtype=np.int32) for _ in range(2))
        for name, data in (("INPUT0", a), ("INPUT1", b)):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            request.raw_input_contents.append(data.tobytes())
        with np.errstate(over="ignore"):
            wanted = {"OUTPUT0": a + b, "OUTPUT1": a - b}

        def exact(reply: pb.ModelInferResponse) -> bool:
            got = _outputs(reply, np.int32)
            return got.keys() == wanted.keys() and all(
                np.array_equal(got[k], v) for k, v in wanted.items()
            )

        return request, exact
    n = int(rng.integers(1, MAX_N + 1))
    x = rng.random(n, dtype=np.float32)
    request.inputs.add(name="x", datatype="FP32", shape=[n])
    request.raw_input_contents.append(x.tobytes())
    reference = references.find(model)
    assert reference is not None

    def close(reply: pb.ModelInferResponse) -> bool:
        (got,) = _outputs(reply, np.float32).values()
        (comparison,) = references.compare(reference, [x], [got], {"n": n})
        return comparison.ok

    return request, close


def _outputs(reply: pb.ModelInferResponse, dtype: type[np.generic]) -> dict[str, Any]:
    return {
        tensor.name: np.frombuffer(raw, dtype=dtype)
        for tensor, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)
    }


def _stub(life: Life, rng: np.random.Generator) -> tuple[grpc.Channel, Any]:
    target = life.unix_target if rng.integers(2) else life.tcp_target
    channel = grpc.insecure_channel(target)
    return channel, open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)


def kserve(life: Life, rng: np.random.Generator, counts: Counts) -> None:
    stop_at = time.monotonic() + life.seconds
    channel, stub = _stub(life, rng)
    with channel:
        for number in itertools.count():
            if time.monotonic() >= stop_at:
                return
            request, check = infer_case(rng, str(number))
            _tally(counts, check(stub.ModelInfer(request, timeout=30)))


def kserve_stream(life: Life, rng: np.random.Generator, counts: Counts) -> None:
    """Streams one after another, each of a few batches of up to 8 requests in flight."""
    stop_at = time.monotonic() + life.seconds
    channel, stub = _stub(life, rng)
    numbers = itertools.count()
    with channel:
        while time.monotonic() < stop_at:
            sent: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()

            def requests(sent: queue.Queue[pb.ModelInferRequest | None] = sent) -> Iterator[Any]:
                while (request := sent.get()) is not None:
                    yield request

            replies = stub.ModelStreamInfer(requests(), timeout=60)
            try:
                for _ in range(int(rng.integers(1, 20))):
                    if time.monotonic() >= stop_at:
                        break
                    batch = dict(
                        (str(n), infer_case(rng, str(n)))
                        for n in itertools.islice(numbers, int(rng.integers(1, 9)))
                    )
                    for request, _ in batch.values():
                        sent.put(request)
                    for _ in batch:
                        reply = next(replies)
                        if reply.error_message:
                            raise RuntimeError(f"ModelStreamInfer: {reply.error_message}")
                        _tally(counts, batch[reply.infer_response.id][1](reply.infer_response))
            finally:
                sent.put(None)
            for extra in replies:
                raise RuntimeError(f"an answer past the requests: {extra}")


WORK: dict[str, Callable[[Life, np.random.Generator, Counts], None]] = {
    "ring": ring,
    "ring_stream": ring_stream,
    "kserve": kserve,
    "kserve_stream": kserve_stream,
}
