"""Who is at the other end of a call: its connection, whether it is local, and its user.

gRPC gives a call's peer as text: ``ipv4:127.0.0.1:5123`` or ``ipv6:[::1]:5123``
on TCP (one per connection) and a bare ``unix:`` on a Unix socket (the same for
every connection there). For a TCP peer on the loopback the kernel's socket
table (``/proc/net/tcp``, ``tcp6``) says which user owns the caller's end of the
connection and whether it is still open: the daemon judges shared-memory
objects by that user and drops a dead connection's client at once.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Peer", "TcpTable", "parse_peer"]

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_ESTABLISHED = "01"


@dataclass(frozen=True, slots=True)
class Peer:
    text: str
    """As gRPC gives it: one value per TCP connection, ``unix:`` for any Unix-socket call."""
    unix: bool
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    port: int = 0

    @property
    def local(self) -> bool:
        """On this host: the Unix socket, or TCP from a loopback address."""
        if self.unix:
            return True
        address = self.address
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address is not None and address.is_loopback

    @property
    def socket_keys(self) -> tuple[tuple[str, int], ...]:
        """How the kernel's socket tables may write this peer's end (its local address): an
        IPv4 peer's socket is often an IPv6 one with the IPv4-mapped address (gRPC's are)."""
        address = self.address
        if address is None:
            return ()
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        forms = [address]
        if isinstance(address, ipaddress.IPv4Address):
            forms.append(ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed))
        return tuple((_hex(form.packed), self.port) for form in forms)


def _hex(raw: bytes) -> str:
    """An address as the socket tables print it: 32-bit words in the host's byte order."""
    words = [raw[i : i + 4] for i in range(0, len(raw), 4)]
    return "".join(f"{int.from_bytes(w, 'little'):08X}" for w in words)


def parse_peer(text: str) -> Peer:
    """A call's peer from gRPC's text; anything unparsed is a remote peer without address."""
    if text.startswith("unix:") or text.startswith("unix-abstract:"):
        return Peer(text, True)
    kind, _, rest = text.partition(":")
    host, _, port = rest.rpartition(":")
    try:
        if kind == "ipv4":
            return Peer(text, False, ipaddress.IPv4Address(host), int(port))
        if kind == "ipv6":
            return Peer(text, False, ipaddress.IPv6Address(host.strip("[]")), int(port))
    except ValueError:
        pass
    return Peer(text, False)


class TcpTable:
    """One reading of the kernel's TCP tables: the open connections' ends and their users."""

    def __init__(self, tables: Iterable[Path] = _TABLES) -> None:
        self._ends: dict[tuple[str, int], int] = {}
        for table in tables:
            try:
                lines = table.read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if len(fields) < 8 or fields[3] != _ESTABLISHED:
                    continue
                address, _, port = fields[1].partition(":")
                self._ends[(address, int(port, 16))] = int(fields[7])

    def owner(self, peer: Peer) -> int | None:
        """The user owning ``peer``'s end of its connection; ``None``: not open (or not here)."""
        for key in peer.socket_keys:
            owner = self._ends.get(key)
            if owner is not None:
                return owner
        return None
