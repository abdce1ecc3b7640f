"""Reading ring records on the daemon's side: the fields of a record copied out of its slot.

Nothing here trusts the bytes: a record is a copy of its slot (the client may write it
while the daemon reads), and every field is checked by its reader.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from accy.protocol import dtype_named
from accy.protocol import ring as layout
from accyd.catalog.dtypes import DType
from accyd.catalog.model import ScalarSpec
from accyd.errors import InvalidRequest

__all__ = ["KEY", "KEY_END", "id_of", "scalar_struct"]

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
