"""Who is at the other end of a call: its connection, whether it is local, and its user.

gRPC gives a call's peer as text: ``ipv4:127.0.0.1:5123`` or ``ipv6:[::1]:5123``
on TCP (one per connection) and a bare ``unix:`` on a Unix socket (the same for
every connection there). For a TCP peer on the loopback the kernel's socket
table (``/proc/net/tcp``, ``tcp6``) says which user owns the caller's end of the
connection and whether it is still open: the daemon judges shared-memory
objects by that user and drops a dead connection's client at once. A Unix
socket's caller is nobody in particular: only when no other user may connect
(``others_may_connect``) is it this daemon's own user.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Peer", "TcpTable", "loopback_owner", "others_may_connect", "parse_peer"]

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
    """One reading of the kernel's TCP tables: the open connections' ends and their users.

    The text is kept as read and searched for the ends asked about (a C-speed scan each),
    never split line by line in Python: a local user who opens 16,000 connections made
    that a per-line parse under the GIL at every new loopback caller and every sweep.
    """

    def __init__(self, tables: Iterable[Path] = _TABLES, *, readings: int = 1) -> None:
        """Each table read ``readings`` times; an end found in any reading is open. The
        kernel lists a table in chunks while connections open and close, and a live one can
        fall between two chunks of one reading: whoever would act on an end's absence (call
        a caller a stranger, drop a client) asks a second reading first."""
        self._texts: list[bytes] = []
        for table in tables:
            for _ in range(readings):
                try:
                    self._texts.append(table.read_bytes())
                except OSError:
                    break

    def owner(self, peer: Peer) -> int | None:
        """The user owning ``peer``'s end of its connection; ``None``: not open (or not here)."""
        for address, port in peer.socket_keys:
            # The local address is the field right after the slot number's ':', so a line
            # naming this end as its *remote* address (the daemon's own end) never matches.
            key = f": {address}:{port:04X} ".encode()
            for text in self._texts:
                at = text.find(key)
                while at >= 0:
                    end = text.find(b"\n", at)
                    fields = text[at + 2 : end if end >= 0 else len(text)].split()
                    if len(fields) >= 7 and fields[2] == _ESTABLISHED.encode():
                        return int(fields[6])
                    at = text.find(key, at + 1)
        return None


def loopback_owner(peer: Peer, tables: Iterable[Path] = _TABLES) -> int | None:
    """*Blocking* (a reading takes milliseconds on some kernels). The user owning a loopback
    ``peer``'s end, from one reading of the tables, or a second where the first missed it
    (``TcpTable``); ``None``: not open here (another network namespace)."""
    tables = tuple(tables)
    found = TcpTable(tables).owner(peer)
    return found if found is not None else TcpTable(tables).owner(peer)


def others_may_connect(socket_path: Path) -> bool:
    """Whether a user other than this process's (and root) may connect to ``socket_path``.

    Connecting takes write permission on the socket and search permission on every
    folder above it: the socket is this user's alone when it is this user's and shuts
    out group and others, or when one of its folders does. Anything unreadable counts
    as reachable. (ACLs are not read: an operator who grants them shares the socket.)
    """
    me = os.geteuid()
    try:
        status = socket_path.lstat()
        if status.st_uid == me and not status.st_mode & 0o022:
            return False
        for folder in socket_path.absolute().parents:
            status = folder.stat()
            if status.st_uid == me and not status.st_mode & 0o011:
                return False
    except OSError:
        return True
    return True
