"""Launch arguments: counts, the client's buffers for each operand and result, hazards, tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from accyd.catalog.dtypes import DType
from accyd.catalog.model import BufferSpec, Pipeline
from accyd.core.buffers import BufferRecord
from accyd.core.clients import Client
from accyd.core.marks import Mark
from accyd.errors import InvalidRequest, LaunchArgumentMismatch

__all__ = ["Tensor", "check_counts", "check_tensors", "hazards", "launch_buffers", "note"]


@dataclass(frozen=True, slots=True)
class Tensor:
    """Inline data of the one-call path: little-endian elements, packed."""

    name: str
    dtype: DType | None
    data: bytes


def check_counts(pipeline: Pipeline, operands: int, results: int | None = None) -> None:
    for role, given, specs in (
        ("operands", operands, pipeline.operands),
        ("results", results, pipeline.results),
    ):
        if given is not None and given != len(specs):
            raise LaunchArgumentMismatch(
                f"{pipeline.target} takes {len(specs)} {role}; got {given}", field=role
            )


def launch_buffers(
    client: Client,
    device: int,
    role: str,
    specs: Sequence[BufferSpec],
    ids: Sequence[str],
) -> list[BufferRecord]:
    """The client's buffers named by ``ids``, each on ``device`` and of its operand's dtype.

    A buffer allocated without a dtype fits any operand (its bytes are taken as
    they are); one allocated with another dtype is refused, naming the operand.
    """
    records = []
    for index, (spec, buffer_id) in enumerate(zip(specs, ids, strict=True)):
        field = f"{role}[{index}]"
        record = client.buffer(buffer_id, field)
        if record.device != device:
            raise LaunchArgumentMismatch(
                f"buffer {buffer_id} is on device {record.device}; the session runs on "
                f"device {device}",
                field=field,
            )
        if record.dtype is not None and record.dtype is not spec.dtype:
            raise LaunchArgumentMismatch(
                f"{role[:-1]} {spec.name!r} is {spec.dtype.value}; buffer {buffer_id} was "
                f"allocated as {record.dtype.value}",
                field=field,
            )
        records.append(record)
    return records


def hazards(operands: Sequence[BufferRecord], results: Sequence[BufferRecord]) -> list[Mark]:
    """What a launch waits for: the last write of what it reads, every use of what it writes."""
    marks = [mark for record in operands for mark in record.read_hazards()]
    return marks + [mark for record in results for mark in record.write_hazards()]


def note(mark: Mark, operands: Sequence[BufferRecord], results: Sequence[BufferRecord]) -> None:
    """Record a launch's reads and writes on its buffers (under the core's lock)."""
    written = {id(record) for record in results}
    for record in operands:
        if id(record) not in written:
            record.note_read(mark)
    for record in results:
        record.note_write(mark)


def check_tensors(pipeline: Pipeline, operands: Sequence[Tensor]) -> None:
    """The one-call path's operands: count, names, dtypes, whole elements."""
    check_counts(pipeline, len(operands))
    for index, (spec, tensor) in enumerate(zip(pipeline.operands, operands, strict=True)):
        where = f"operands[{index}]"
        if tensor.name and tensor.name != spec.name:
            raise LaunchArgumentMismatch(
                f"operand {index} is {spec.name!r}, not {tensor.name!r}", field=f"{where}.name"
            )
        if tensor.dtype is not None and tensor.dtype is not spec.dtype:
            raise LaunchArgumentMismatch(
                f"operand {spec.name!r} is {spec.dtype.value}, not {tensor.dtype.value}",
                field=f"{where}.dtype",
            )
        if not tensor.data or len(tensor.data) % spec.dtype.itemsize:
            raise InvalidRequest(
                f"operand {spec.name!r} needs a positive whole number of {spec.dtype.value} "
                f"elements; got {len(tensor.data)} bytes",
                field=f"{where}.data",
            )
