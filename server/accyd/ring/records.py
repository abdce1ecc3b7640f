"""Reading ring records on the daemon's side: a batch copied out at once, and record fields.

Nothing here trusts the bytes: a batch is a copy of the slots (the client may
write them while the daemon reads), and every field is checked by its reader.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from accy.protocol import ring as layout
from accyd.catalog.dtypes import DType
from accyd.catalog.model import ScalarSpec
from accyd.errors import InvalidRequest

__all__ = ["KEY", "KEY_END", "KIND", "LAUNCH_KIND", "Batch", "id_of", "scalar_struct"]

KEY, KEY_END = 12, layout.RECORD.size
"""The bytes of a launch record that say what it launches: handles, counts and scalars."""
KIND = 8
"""Where a record's kind (u16) is."""
LAUNCH_KIND = int(layout.Kind.LAUNCH).to_bytes(2, "little")

_SLOT_WORDS = layout.SLOT_SIZE // 8
_CODES = {
    DType.F32: "f4x",
    DType.F64: "d",
    DType.I32: "i4x",
    DType.U32: "I4x",
    DType.I64: "q",
    DType.U64: "Q",
    DType.U8: "B7x",
}


class Batch:
    """Records taken together: a copy of their slots, and the sessions their launches used."""

    __slots__ = ("_words", "first", "launches", "reap", "records")

    def __init__(self, records: bytes, first: int) -> None:
        self.records = records
        self.first = first
        """The first record's seq."""
        self._words = memoryview(records).cast("Q")
        self.launches: dict[str, int] = {}
        """Launches enqueued in the batch, by session."""
        self.reap: set[str] = set()
        """Sessions whose launches ran on scratch of their own: reaped once over."""

    def seq(self, index: int) -> int:
        """The seq that record ``index`` of the batch says it is."""
        return int(self._words[index * _SLOT_WORDS])

    def slot(self, index: int) -> bytes:
        """Record ``index``'s whole slot."""
        at = index * layout.SLOT_SIZE
        return self.records[at : at + layout.SLOT_SIZE]

    def launched(self, what: tuple[str, bool] | None, count: int = 1) -> None:
        """Note what taking records gave: ``count`` launches of a session (and whether they
        ran on scratch of their own), or nothing."""
        if what is not None:
            session = what[0]
            self.launches[session] = self.launches.get(session, 0) + count
            if what[1]:
                self.reap.add(session)


def scalar_struct(specs: Sequence[ScalarSpec]) -> struct.Struct:
    """How a record's scalar bytes unpack for a session taking ``specs`` (at most
    ``MAX_SCALARS``): each value in its own dtype, in an 8-byte field."""
    code = "<" + "".join(_CODES[s.dtype] for s in specs)
    return struct.Struct(code + f"{8 * (layout.MAX_SCALARS - len(specs))}x")


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
