"""Requests and local refusals made alike by the blocking client and ``accy.aio``.

Each function here is pure (no call, no I/O): it checks what the caller gave and
builds the message, or reads an answer, so both clients refuse the same
mistakes with the same typed error and message before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from accy import _chunks, _dtypes
from accy._dtypes import DTypeLike
from accy._models import PipelineInfo
from accy._scalars import check_scalars, pack_scalars
from accy._seam import LaunchRequest, ids_of, session_id_on
from accy.errors import FailedPrecondition, FieldViolation, InvalidArgument, NotFound
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = [
    "ReadPlan",
    "allocation_request",
    "check_out",
    "check_range",
    "freed_error",
    "launch_request",
    "pick_pipeline",
    "read_plan",
    "released_error",
    "run_request",
    "run_results",
    "shaped_read",
    "write_data",
]


# -- pipelines and runs ---------------------------------------------------------------


def pick_pipeline(known: Sequence[PipelineInfo], target: str, version: int) -> PipelineInfo:
    """The newest of ``known`` (one target's versions) matching ``version`` (0: any);
    ``NotFound`` naming it if none does."""
    matches = [p for p in known if version in (0, p.version)]
    if not matches:
        what = f"{target} version {version}" if version else target
        raise NotFound(
            f"the daemon has no pipeline {what}",
            field_violations=[FieldViolation("target", f"unknown pipeline {what}")],
        )
    return max(matches, key=lambda p: p.version)


def run_request(
    info: PipelineInfo,
    target: str,
    version: int,
    format: str,
    operands: Sequence[Any],
    scalars: Mapping[str, float],
) -> tuple[pb.RunRequest, dict[str, float]]:
    """The ``Run`` request for ``operands`` (arrays) and ``scalars``, and the scalars it
    sends: a runtime scalar that an operand's extent (or one dim of its shape) names alone
    defaults to the array's length (or that dim)."""
    arrays = [np.asarray(a) for a in operands]
    if len(arrays) != len(info.operands):
        raise InvalidArgument(
            f"{target} takes {len(info.operands)} operands, got {len(arrays)}",
            field_violations=[FieldViolation("operands", "wrong count")],
        )
    tensors = []
    values: dict[str, float] = dict(scalars)
    for index, (spec, array) in enumerate(zip(info.operands, arrays, strict=True)):
        kind = spec.dtype or _dtypes.to_numpy(array.dtype)
        if array.dtype.newbyteorder("<") != kind:
            why = f"is {array.dtype}, the pipeline takes {_dtypes.name_of(kind)}"
            raise InvalidArgument(
                f"operand {spec.name!r} {why}",
                field_violations=[FieldViolation(f"operands[{index}]", why)],
            )
        spec.default_scalars(array, values)
        tensors.append(
            pb.Tensor(
                name=spec.name,
                dtype=_dtypes.to_wire(kind),
                data=_chunks.as_bytes(array, kind).tobytes(),
            )
        )
    request = pb.RunRequest(
        target=target,
        version=version,
        format=format,
        operands=tensors,
        runtime_scalars=pack_scalars(info.runtime_scalars, values),
    )
    return request, values


def run_results(
    info: PipelineInfo, response: pb.RunResponse, values: Mapping[str, float]
) -> list[np.ndarray[Any, Any]]:
    """A ``Run`` answer's results as arrays in their shapes."""
    results = []
    for spec, tensor in zip(info.results, response.results, strict=False):
        kind = _dtypes.from_wire(tensor.dtype) or np.dtype(np.uint8)
        results.append(spec.shaped(np.frombuffer(tensor.data, dtype=kind).copy(), values))
    return results


# -- sessions and launches --------------------------------------------------------------


def released_error(session_id: str, target: str) -> FailedPrecondition:
    """What any use of a released session raises."""
    return FailedPrecondition(
        f"session {session_id} ({target}) was released; load the pipeline again to use it",
        reason="SESSION_RELEASED",
    )


def launch_request(request: LaunchRequest, link: Any) -> pb.LaunchRequest:
    """A unary ``Launch`` on ``link``: scalars checked first, then the session, then each
    buffer (``ids_of``)."""
    return pb.LaunchRequest(
        runtime_scalars=check_scalars(request.session.info, request.scalars),
        session_id=session_id_on(request.session, link),
        operands=ids_of(request.operands, link, "operands"),
        results=ids_of(request.results, link, "results"),
        wait=request.wait,
    )


# -- buffers ------------------------------------------------------------------------------


def allocation_request(
    nbytes: int, dtype: np.dtype[Any] | None, device: int | None, exportable: bool
) -> pb.AllocateBufferRequest:
    """An ``AllocateBuffer`` request; a negative size is refused here."""
    if nbytes < 0:
        raise InvalidArgument(
            f"a buffer cannot hold {nbytes} bytes",
            field_violations=[FieldViolation("byte_size", "must not be negative")],
        )
    return pb.AllocateBufferRequest(
        byte_size=nbytes, dtype=_dtypes.to_wire(dtype), device=device, exportable=exportable
    )


def freed_error(buffer_id: str) -> InvalidArgument:
    """What any use of a freed buffer raises."""
    return InvalidArgument(
        f"buffer {buffer_id} was freed; make a new one",
        reason="BUFFER_FREED",
        field_violations=[FieldViolation("buffer_id", "the buffer was freed")],
    )


def check_range(buffer_id: str, nbytes: int, offset: int, size: int) -> None:
    """Refuse bytes ``offset..offset + size`` outside a buffer of ``nbytes``."""
    if offset < 0 or size < 0 or offset + size > nbytes:
        why = f"bytes {offset}..{offset + size} are outside 0..{nbytes}"
        raise InvalidArgument(
            f"buffer {buffer_id}: {why}", field_violations=[FieldViolation("offset", why)]
        )


def write_data(
    buffer_id: str,
    dtype: np.dtype[Any] | None,
    nbytes: int,
    array: np.ndarray[Any, Any] | Sequence[Any],
    offset: int,
) -> memoryview:
    """The bytes of a write of ``array`` at byte ``offset``: an ndarray must have the
    buffer's dtype (no silent conversion), a plain sequence is converted to it."""
    data = array if isinstance(array, np.ndarray) else np.asarray(array, dtype=dtype)
    kind = _dtypes.to_numpy(data.dtype)
    if dtype is not None and kind != dtype:
        why = f"is {data.dtype}, the buffer holds {_dtypes.name_of(dtype)}"
        raise InvalidArgument(
            f"buffer {buffer_id}: data {why}", field_violations=[FieldViolation("data", why)]
        )
    raw = _chunks.as_bytes(data, kind)
    check_range(buffer_id, nbytes, offset, len(raw))
    return raw


def check_out(out: np.ndarray[Any, Any], count: int | None) -> np.dtype[Any]:
    """The element type to read into ``out``, which must fit the read."""
    why = ""
    if not (out.flags.c_contiguous and out.flags.writeable):
        why = "must be a writable, C-contiguous array"
    elif count is not None and count != out.size:
        why = f"holds {out.size} elements, the read asks for {count}"
    if why:
        raise InvalidArgument(f"out {why}", field_violations=[FieldViolation("out", why)])
    return _dtypes.to_numpy(out.dtype)


class ReadPlan:
    """What one read asks for: its element type, element count and bytes."""

    __slots__ = ("count", "kind", "size")

    def __init__(self, kind: np.dtype[Any], count: int) -> None:
        self.kind = kind
        self.count = count
        self.size = count * kind.itemsize


def read_plan(
    buffer_id: str,
    nbytes: int,
    own: np.dtype[Any] | None,
    dtype: DTypeLike | None,
    count: int | None,
    offset: int,
    out: np.ndarray[Any, Any] | None,
) -> ReadPlan:
    """A read of ``count`` elements (default: to the end, or ``out``'s size) from byte
    ``offset`` of a buffer of ``nbytes`` holding ``own``; what does not fit raises."""
    kind = _dtypes.to_numpy(dtype) if dtype is not None else own
    kind = kind if kind is not None else np.dtype(np.uint8)
    if out is not None:
        kind = check_out(out, count)
        count = out.size
    if count is None:
        count = max(nbytes - offset, 0) // kind.itemsize
    plan = ReadPlan(kind, count)
    check_range(buffer_id, nbytes, offset, plan.size)
    return plan


def shaped_read(
    got: np.ndarray[Any, Any],
    plan: ReadPlan,
    offset: int,
    own: np.dtype[Any] | None,
    shape: tuple[int, ...] | None,
    size: int,
) -> np.ndarray[Any, Any]:
    """The bytes read as ``plan``'s elements: in the buffer's ``shape`` when the read is the
    whole buffer (``size`` elements of its own type), else flat."""
    whole = shape is not None and offset == 0 and plan.kind == own and plan.count == size
    return got.view(plan.kind).reshape(shape) if whole else got.view(plan.kind)
