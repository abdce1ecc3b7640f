"""Reading ring records on the daemon's side: the fields of a record copied out of its slot.

Nothing here trusts the bytes: a record is a copy of its slot (the client may write it
while the daemon reads), and every field is checked by its reader.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from accy.protocol import dtype_named
from accy.protocol import ring as layout
from accyd.backends.base import ScalarChange
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ScalarSpec
from accyd.core.free_scalars import FreeScalars
from accyd.errors import InvalidRequest

__all__ = ["KEY", "KEY_END", "FreeFields", "free_fields", "id_of", "scalar_struct"]

KEY, KEY_END = layout.LAUNCH_KEY, layout.RECORD.size
"""The bytes of a launch record that say what it launches: handles, counts and scalars."""


def scalar_struct(specs: Sequence[ScalarSpec]) -> struct.Struct:
    """How a record's scalar bytes unpack for a session taking ``specs`` (at most
    ``MAX_SCALARS``): each value in its own dtype, in an 8-byte field."""
    code = "<" + "".join(_record_code(s.dtype) for s in specs)
    return struct.Struct(code + f"{8 * (layout.MAX_SCALARS - len(specs))}x")


def _record_code(dtype: DType) -> str:
    entry = dtype_named(dtype.value)
    if entry is None or not entry.record_code:
        raise InvalidRequest(f"{dtype.value} values cannot be runtime scalars", field="scalars")
    return entry.record_code


def id_of(raw: bytes) -> str:
    """The session or buffer id a BIND record names."""
    length = raw[layout.ID_OFFSET]
    if not 0 < length <= layout.MAX_ID_BYTES:
        raise InvalidRequest(f"id length {length} is not 1..{layout.MAX_ID_BYTES}", field="id")
    start = layout.ID_OFFSET + 1
    try:
        return raw[start : start + length].decode("ascii")
    except UnicodeDecodeError:
        raise InvalidRequest("an id is ASCII", field="id") from None


_FIELD = 8
"""Bytes of one scalar's field in a record."""


@dataclass(frozen=True, slots=True)
class FreeFields:
    """A session's free scalars (``core/free_scalars.py``) as its launch records hold them.

    ``engine`` is what the native engine checks of each value: ``(mask, widths, exponent
    bits)``, fields ``mask`` free, each value ``widths[i]`` bytes, a float's exponent bits
    never all set (not finite: Python refuses it). ``masked`` is a ticket's key with those
    fields zeroed; ``changes`` reads their values back as a prepared launch takes them.
    """

    free: FreeScalars
    fields: tuple[tuple[int, struct.Struct, DType], ...]
    engine: tuple[int, bytes, tuple[int, ...]]

    def masked(self, key: bytes) -> bytes:
        """``key`` (a record's bytes from ``KEY`` to ``KEY_END``) with the free fields zeroed."""
        out = bytearray(key)
        for index, _, _ in self.fields:
            at = layout.SCALARS_OFFSET - KEY + _FIELD * index
            out[at : at + _FIELD] = bytes(_FIELD)
        return bytes(out)

    def changes(self, scalars: bytes) -> list[ScalarChange]:
        """What a prepared launch takes for a record whose scalar bytes are ``scalars`` (from
        ``SCALARS_OFFSET``); a value its dtype cannot hold raises its usual error."""
        values = {
            index: Scalar(dtype, code.unpack_from(scalars, _FIELD * index)[0])
            for index, code, dtype in self.fields
        }
        return self.free.changes(values)


@functools.lru_cache(maxsize=256)
def free_fields(free: FreeScalars) -> FreeFields | None:
    """How records carry ``free``; ``None`` where a record cannot (past ``MAX_SCALARS``)."""
    fields = []
    widths = bytearray(layout.MAX_SCALARS)
    exponents = [0] * layout.MAX_SCALARS
    mask = 0
    for scalar in free.scalars:
        entry = dtype_named(scalar.dtype.value)
        if scalar.index >= layout.MAX_SCALARS or entry is None or not entry.record_code:
            return None
        code = struct.Struct("<" + entry.record_code[0])
        fields.append((scalar.index, code, scalar.dtype))
        mask |= 1 << scalar.index
        widths[scalar.index] = code.size
        if entry.numpy.kind == "f":
            info = np.finfo(entry.numpy)
            exponents[scalar.index] = ((1 << info.nexp) - 1) << info.nmant
    return FreeFields(free, tuple(fields), (mask, bytes(widths), tuple(exponents)))
