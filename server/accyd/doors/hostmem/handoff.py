"""The handoff socket: gives offered file descriptors to the one client holding the ticket.

A client asks for something shared (a ring, a memory segment) over gRPC,
authenticated like any call, and gets its id and a one-time ticket. It then
connects to the handoff socket beside the daemon's own socket, sends the id
and the ticket, and receives the descriptors with ``SCM_RIGHTS``. A ticket is
good once, for ``OFFER_SECONDS``; the socket has the daemon socket's mode, so
only who may call the daemon may connect at all. Nothing handed over has a name
another process could open.

One thread serves every connection without blocking on any of them: the
listener and each connection are non-blocking on one selector, and a whole
hello has one deadline (``HELLO_SECONDS`` from the connect), so a peer that
trickles its bytes, or sends none, holds up no one else and is cut off on
time. Connections waiting for their hello are bounded, per user (the peer's
uid) and in all, so one user cannot fill the daemon's descriptors with them.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import os
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from accy.protocol import ring as layout

__all__ = [
    "HELLO_BYTES",
    "HELLO_SECONDS",
    "OFFER_SECONDS",
    "PENDING_PER_USER",
    "PENDING_TOTAL",
    "Handoff",
    "Offered",
]

log = structlog.get_logger("accyd.doors.hostmem.handoff")

OFFER_SECONDS = 10.0
HELLO_BYTES = 64 + layout.TICKET_BYTES
"""What a client sends on the handoff socket: the object's id (NUL-padded) and its ticket."""
HELLO_SECONDS = 2.0
"""How long a connection has, from its connect, to send its whole hello."""
PENDING_PER_USER = 128
"""Connections of one user (peer uid) waiting for their hello at once; past it, refused."""
PENDING_TOTAL = 512
"""Connections of all users waiting for their hello at once; past it, refused."""
TICK_SECONDS = 0.25
"""The longest the thread sleeps: expired offers are dropped at least this often."""
_UCRED = struct.Struct("3i")


def _nothing() -> None:
    return None


@dataclass(slots=True)
class Offered:
    """One thing offered to one client: what it gets and what happens around the handoff."""

    object_id: str
    client_id: str
    fds: Callable[[], list[int]]
    """The descriptors sent (the daemon keeps its own; the client gets duplicates)."""
    taken: Callable[[], None] = _nothing
    """Run under the offers' lock just before the descriptors go out."""
    failed: Callable[[], None] = _nothing
    """Run when sending failed after ``taken``."""
    dropped: Callable[[], None] = _nothing
    """Run when the offer expires or its client goes before taking it."""
    sent: Callable[[], None] = _nothing
    """Run once the descriptors went out."""


@dataclass(slots=True)
class _Offer:
    offered: Offered
    ticket: bytes
    expires: float


@dataclass(slots=True, eq=False)
class _Hello:
    """One connection on its way to a handoff: what it sent so far and its deadline."""

    conn: socket.socket
    uid: int
    peer: str
    deadline: float
    data: bytearray = field(default_factory=bytearray)


def _credentials(conn: socket.socket) -> tuple[int, int]:
    """The peer's (pid, uid), from the kernel (``SO_PEERCRED``); (-1, -1) where unknown."""
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return -1, -1
    pid, uid, _gid = _UCRED.unpack(raw)
    return pid, uid


class Handoff:
    """The handoff socket, its accept thread and the offers waiting on it."""

    def __init__(self, socket_path: Path) -> None:
        self.path = socket_path.with_name(socket_path.name + layout.HANDOFF_SUFFIX)
        self._offers: dict[str, _Offer] = {}
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._hellos: dict[socket.socket, _Hello] = {}
        self._per_user: dict[int, int] = {}
        self.refused_connections = 0
        """Connections closed at once: over the bounds, or past their deadline."""

    @property
    def open(self) -> bool:
        return not self._closing and self._listener is not None

    def start(self, mode: int = 0o660) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(str(self.path))
        os.chmod(self.path, mode)
        listener.listen(256)
        listener.setblocking(False)
        self._inode = self.path.stat().st_ino
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="accyd-handoff", daemon=True)
        self._thread.start()

    def offer(self, offered: Offered) -> bytes:
        """Offer ``offered`` to its client; the one-time ticket it must show. An offer not
        taken yet under the same id is dropped: its ticket no longer works."""
        ticket = secrets.token_bytes(layout.TICKET_BYTES)
        with self._lock:
            expired = self._expire()
            replaced = self._offers.get(offered.object_id)
            if replaced is not None:
                expired.append(replaced.offered)
            self._offers[offered.object_id] = _Offer(
                offered, ticket, time.monotonic() + OFFER_SECONDS
            )
        for gone in expired:
            gone.dropped()
        return ticket

    def withdraw_client(self, client_id: str) -> list[str]:
        """Drop every offer to ``client_id`` not taken yet; the ids dropped."""
        with self._lock:
            ids = [i for i, o in self._offers.items() if o.offered.client_id == client_id]
            gone = [self._offers.pop(i).offered for i in ids]
        for offered in gone:
            offered.dropped()
        return ids

    def close(self) -> None:
        """Stop handing over and drop every offer; removes only our own socket."""
        self._closing = True
        if self._thread is not None:
            self._thread.join(2.0)
        if self._listener is not None:
            self._listener.close()
        with contextlib.suppress(OSError):
            if self._inode is not None and self.path.stat().st_ino == self._inode:
                self.path.unlink()
        with self._lock:
            offers, self._offers = list(self._offers.values()), {}
        for offer in offers:
            offer.offered.dropped()

    def _expire(self) -> list[Offered]:
        """Under the lock: take the expired offers out (the caller drops them)."""
        now = time.monotonic()
        expired = [i for i, o in self._offers.items() if o.expires < now]
        return [self._offers.pop(i).offered for i in expired]

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            try:
                while not self._closing:
                    self._round(selector, listener)
            finally:
                for hello in list(self._hellos.values()):
                    self._drop(selector, hello)

    def _round(self, selector: selectors.BaseSelector, listener: socket.socket) -> None:
        """Wait for the next event or deadline, serve what is ready, drop what is late."""
        now = time.monotonic()
        soonest = min((hello.deadline for hello in self._hellos.values()), default=now + 1)
        try:
            events = selector.select(max(0.0, min(soonest - now, TICK_SECONDS)))
        except OSError:
            self._closing = True
            return
        for key, _ in events:
            if key.fileobj is listener:
                self._take_connections(selector, listener)
            else:
                hello = self._hellos.get(key.fileobj)  # type: ignore[call-overload]
                if hello is not None:
                    self._read(selector, hello)
        now = time.monotonic()
        for hello in [h for h in self._hellos.values() if h.deadline <= now]:
            self.refused_connections += 1
            log.info("handoff hello too slow; closed", peer=hello.peer, got=len(hello.data))
            self._drop(selector, hello)
        with self._lock:
            expired = self._expire()
        for offered in expired:
            offered.dropped()

    def _take_connections(self, selector: selectors.BaseSelector, listener: socket.socket) -> None:
        """Accept every connection waiting (never blocking), within the bounds."""
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE):  # none left: wait, retry
                    time.sleep(0.05)
                    return
                self._closing = True
                return
            conn.setblocking(False)
            pid, uid = _credentials(conn)
            peer = f"pid {pid} uid {uid}"
            if len(self._hellos) >= PENDING_TOTAL or self._per_user.get(uid, 0) >= PENDING_PER_USER:
                self.refused_connections += 1
                log.info("handoff connection refused: too many waiting", peer=peer)
                conn.close()
                continue
            hello = _Hello(conn, uid, peer, time.monotonic() + HELLO_SECONDS)
            self._hellos[conn] = hello
            self._per_user[uid] = self._per_user.get(uid, 0) + 1
            selector.register(conn, selectors.EVENT_READ)

    def _drop(self, selector: selectors.BaseSelector, hello: _Hello) -> None:
        if self._hellos.pop(hello.conn, None) is None:
            return
        left = self._per_user.get(hello.uid, 1) - 1
        if left > 0:
            self._per_user[hello.uid] = left
        else:
            self._per_user.pop(hello.uid, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            selector.unregister(hello.conn)
        hello.conn.close()

    def _read(self, selector: selectors.BaseSelector, hello: _Hello) -> None:
        try:
            part = hello.conn.recv(HELLO_BYTES - len(hello.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            part = b""
        if not part:  # the peer went away before its hello was whole
            self._drop(selector, hello)
            return
        hello.data += part
        if len(hello.data) < HELLO_BYTES:
            return
        try:
            self._hand_over(hello.conn, bytes(hello.data), hello.peer)
        except OSError as error:
            log.info("handoff failed", peer=hello.peer, error=str(error))
        finally:
            self._drop(selector, hello)

    def _hand_over(self, conn: socket.socket, hello: bytes, peer: str) -> None:
        """Answer a whole hello: the descriptors for a good ticket, a refusal otherwise. The
        answer is one byte (and the descriptors) into an empty socket: it never blocks."""
        object_id = hello[:64].rstrip(b"\0").decode("ascii", "replace")
        ticket = hello[64:]
        with self._lock:
            offer = self._offers.get(object_id)
            good = offer is not None and hmac.compare_digest(offer.ticket, ticket)
            if offer is not None and good:
                del self._offers[object_id]
                # Under the lock, so a withdrawal that follows finds it taken.
                offer.offered.taken()
        if offer is None or not good:
            conn.send(b"\x00")
            log.info("handoff refused", object_id=object_id[:64], peer=peer)
            return
        try:
            socket.send_fds(conn, [b"\x01"], offer.offered.fds())
        except OSError:
            offer.offered.failed()
            raise
        offer.offered.sent()
        log.info("handed over", object_id=object_id, client_id=offer.offered.client_id)
