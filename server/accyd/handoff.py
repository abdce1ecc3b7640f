"""The handoff socket: gives offered file descriptors to the one client holding the ticket.

A client asks for something shared (a ring, a memory segment) over gRPC,
authenticated like any call, and gets its id and a one-time ticket. It then
connects to the handoff socket beside the daemon's own socket, sends the id
and the ticket, and receives the descriptors with ``SCM_RIGHTS``. A ticket is
good once, for ``OFFER_SECONDS``; the socket has the daemon socket's mode, so
only who may call the daemon may connect at all. Nothing handed over has a name
another process could open.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from accy.protocol import ring as layout

__all__ = ["HELLO_BYTES", "OFFER_SECONDS", "Handoff", "Offered"]

log = structlog.get_logger("accyd.handoff")

OFFER_SECONDS = 10.0
HELLO_BYTES = 64 + layout.TICKET_BYTES
"""What a client sends on the handoff socket: the object's id (NUL-padded) and its ticket."""


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

    @property
    def open(self) -> bool:
        return not self._closing and self._listener is not None

    def start(self, mode: int = 0o660) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(str(self.path))
        os.chmod(self.path, mode)
        listener.listen(64)
        listener.settimeout(0.25)
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
        assert self._listener is not None
        while not self._closing:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                with self._lock:
                    expired = self._expire()
                for offered in expired:
                    offered.dropped()
                continue
            except OSError:
                return
            with conn:
                try:
                    self._hand_over(conn)
                except OSError as error:
                    log.info("handoff failed", error=str(error))

    def _hand_over(self, conn: socket.socket) -> None:
        conn.settimeout(2.0)
        hello = b""
        while len(hello) < HELLO_BYTES:
            part = conn.recv(HELLO_BYTES - len(hello))
            if not part:
                return
            hello += part
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
            conn.sendall(b"\x00")
            log.info("handoff refused", object_id=object_id[:64])
            return
        try:
            socket.send_fds(conn, [b"\x01"], offer.offered.fds())
        except OSError:
            offer.offered.failed()
            raise
        offer.offered.sent()
        log.info("handed over", object_id=object_id, client_id=offer.offered.client_id)
