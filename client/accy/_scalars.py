"""Runtime scalars: checked the same way on every path, typed for gRPC, packed for ring records.

Every launch's scalars are checked here before anything is sent, whichever way
it travels: an unknown name, a missing one, or a value its declared type cannot
hold raises the same ``InvalidArgument`` on the shared ring, the ring over a
stream and a unary call. Bounds are the daemon's to judge (it holds the
catalog); so is everything else about the launch.
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, cast

import numpy as np

from accy._dtypes import name_of
from accy._models import PipelineInfo, ScalarSpec
from accy.errors import FieldViolation, InvalidArgument
from accy.protocol import WireDType, dtype_named, dtype_of_numpy
from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2

__all__ = ["RecordScalars", "check_scalars", "pack_scalars"]


def _kinds(base: type) -> frozenset[type]:
    """``base`` and every class below it (numpy's scalar types of one kind)."""
    found: set[type] = {base}
    todo: list[type] = [base]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            found.add(sub)
            todo.append(sub)
    return frozenset(found)


_INTEGERS = frozenset({int}) | _kinds(np.integer)
_NUMBERS = _INTEGERS | frozenset({float}) | _kinds(np.floating)
"""The types a record's quick check takes for integer and for floating-point scalars."""


def _field(name: str) -> str:
    return f"runtime_scalars[{name}]"


def _bad(name: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"runtime scalar {name!r}: {why}",
        reason="LOCAL_SCALAR_INVALID",
        field_violations=[FieldViolation(_field(name), why)],
    )


def _missing(target: str, spec: ScalarSpec) -> InvalidArgument:
    """The daemon's own words for a launch without ``spec``'s value."""
    message = f"{target} needs runtime scalar {spec.name!r} ({name_of(spec.dtype)})"
    return InvalidArgument(
        message,
        reason="LAUNCH_ARGUMENT_MISMATCH",
        field_violations=[FieldViolation(_field(spec.name), message)],
    )


def _scalar(field: str, value: float) -> launch_pb2.Scalar:
    scalar = launch_pb2.Scalar()
    setattr(scalar, field, value)
    return scalar


def _pack(spec: ScalarSpec, value: object) -> launch_pb2.Scalar:
    dtype = spec.dtype
    name = name_of(dtype)
    entry = dtype_named(name)
    if entry is None or not entry.scalar:
        raise _bad(spec.name, f"the protocol has no {name} scalars")
    if isinstance(value, bool | np.bool_):
        raise _bad(spec.name, f"expected a number for {name}, got a boolean")
    low, high = entry.range
    if entry.is_integer:
        if not isinstance(value, int | np.integer):
            raise _bad(spec.name, f"expected an integer for {name}, got {value!r}")
        integer = int(value)
        if not low <= integer <= high:
            raise _bad(spec.name, f"{integer} does not fit {name} ({low}..{high})")
        return _scalar(name, integer)
    if not isinstance(value, int | float | np.integer | np.floating):
        raise _bad(spec.name, f"expected a number for {name}, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or abs(number) > high:
        raise _bad(spec.name, f"{value} is not a finite {name}")
    return _scalar(name, number)


def _known(values: Mapping[str, object], declared: Collection[str]) -> None:
    """Refuse the first name in ``values`` that is not ``declared``."""
    for name in values:
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise _bad(name, f"the pipeline has no such scalar (it takes: {known})")


def pack_scalars(
    specs: Sequence[ScalarSpec], values: Mapping[str, object]
) -> dict[str, launch_pb2.Scalar]:
    """Type each named value by the pipeline's declaration; unknown names are refused here.

    Missing names are not (``AllocateIntermediates`` and ``Run`` take what they need);
    a launch's scalars go through ``check_scalars``, which refuses those too.
    """
    by_name = {spec.name: spec for spec in specs}
    _known(values, by_name)
    return {name: _pack(by_name[name], value) for name, value in values.items()}


def check_scalars(info: PipelineInfo, values: Mapping[str, object]) -> dict[str, launch_pb2.Scalar]:
    """A launch's scalars, typed for the wire; the first thing wrong with them raises (an
    unknown name, then each declared scalar in order: missing, or a value it cannot hold)."""
    specs = info.runtime_scalars
    _known(values, {spec.name for spec in specs})
    packed = {}
    for spec in specs:
        if spec.name not in values:
            raise _missing(info.target, spec)
        packed[spec.name] = _pack(spec, values[spec.name])
    return packed


class RecordScalars:
    """How one pipeline's scalars go into a ring record: picked in order, checked by type and
    range in a few comparisons, packed by one struct straight into the slot.

    ``values`` is made for the pipeline's scalars (as ``dataclasses`` and ``namedtuple``
    make their methods: from source, each value a local), so that a launch whose scalars
    pass the quick check (Python or numpy numbers of the right kind, in the type's range,
    finite) costs a few comparisons; anything else goes through ``check_scalars``, which
    raises what is wrong or lets numbers of other types through.
    """

    __slots__ = ("count", "names", "packer", "values")

    def __init__(self, info: PipelineInfo) -> None:
        specs = info.runtime_scalars
        if len(specs) > layout.MAX_SCALARS:
            raise InvalidArgument(
                f"{info.target} takes {len(specs)} runtime scalars; a ring record carries at "
                f"most {layout.MAX_SCALARS} (launch it with ACCY_RING=0)",
                reason="TOO_MANY_SCALARS",
            )
        self.names = tuple(spec.name for spec in specs)
        self.count = len(specs)
        code = "".join(_wire_entry(spec).record_code for spec in specs)
        self.packer = struct.Struct(f"<{code}{8 * (layout.MAX_SCALARS - len(specs))}x")
        self.values = _values_of(info)
        """``values(scalars)``: the values to pack, in the record's order; what is wrong
        with them raises."""


def _wire_entry(spec: ScalarSpec) -> WireDType:
    """The protocol's entry for a scalar's type; one no record or message carries is refused."""
    entry = dtype_of_numpy(spec.dtype)
    if entry is None or not entry.scalar:
        raise _bad(spec.name, f"the protocol has no {name_of(spec.dtype)} scalars")
    return entry


def _values_of(info: PipelineInfo) -> Callable[[Mapping[str, object]], tuple[object, ...]]:
    """``RecordScalars.values`` for ``info``'s scalars."""
    pick = _picker(tuple(spec.name for spec in info.runtime_scalars))

    def slow(scalars: Mapping[str, object]) -> tuple[object, ...]:
        check_scalars(info, scalars)
        return pick(scalars)

    names: dict[str, object] = {"slow": slow}
    take, test = [], []
    for index, spec in enumerate(info.runtime_scalars):
        entry = _wire_entry(spec)
        low, high = entry.range
        kinds = _INTEGERS if entry.is_integer else _NUMBERS
        names.update({f"K{index}": kinds, f"L{index}": low, f"H{index}": high})
        take.append(f"            v{index} = scalars[{spec.name!r}]")
        test.append(f"type(v{index}) in K{index} and L{index} <= v{index} <= H{index}")
    count = len(info.runtime_scalars)
    body = "\n".join(take) if take else "            pass"
    source = f"""def values(scalars):
    if len(scalars) == {count}:
        try:
{body}
        except KeyError:
            return slow(scalars)
        if {" and ".join(test) or "True"}:
            return ({"".join(f"v{i}, " for i in range(count))})
    return slow(scalars)
"""
    exec(source, names)
    return cast(Callable[[Mapping[str, object]], tuple[object, ...]], names["values"])


def _picker(names: tuple[str, ...]) -> Callable[[Mapping[str, object]], tuple[object, ...]]:
    """What takes the values of ``names`` from a launch's scalars, in order (``KeyError``
    for a missing one)."""
    if not names:
        return lambda scalars: ()
    if len(names) == 1:
        (name,) = names
        return lambda scalars: (scalars[name],)
    return cast(Callable[[Mapping[str, Any]], tuple[object, ...]], operator.itemgetter(*names))
