"""The ring front door: offers rings to attached clients and hands them over a Unix socket.

A client asks for a ring over gRPC (authenticated like any call) and gets a
ring id and a one-time ticket. It then connects to the handoff socket beside
the daemon's own socket, sends the id and the ticket, and receives the ring's
memory and eventfds with ``SCM_RIGHTS``. A ticket is good once, for
``OFFER_SECONDS``; the handoff socket has the daemon socket's mode, so only
who may call the daemon may connect at all. Containers that share the socket's
volume find the handoff socket beside the socket they were given.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from accy.protocol import ring as layout
from accyd.core.ids import new_id
from accyd.errors import InvalidRequest, Unavailable
from accyd.ring.memory import RingMemory
from accyd.ring.ring import RingCore, ServerRing
from accyd.ring.submitter import Submitter

__all__ = ["OFFER_SECONDS", "RingDoor", "RingOffer"]

log = structlog.get_logger("accyd.ring")

OFFER_SECONDS = 10.0
MAX_SLOTS = 4096
DEFAULT_SLOTS = 1024
_HELLO = 64 + layout.TICKET_BYTES
"""What a client sends on the handoff socket: its ring id (NUL-padded) and its ticket."""


@dataclass(frozen=True, slots=True)
class RingOffer:
    ring_id: str
    ticket: bytes
    handoff_name: str
    """The handoff socket's file name, in the folder of the socket the client dialled."""
    slots: int


@dataclass(slots=True)
class _Offer:
    ring: ServerRing
    ticket: bytes
    expires: float


class RingDoor:
    """Owns every ring (through its submitter), the handoff socket and its accept thread."""

    def __init__(
        self, core: RingCore, socket_path: Path, *, submitter: Submitter | None = None
    ) -> None:
        self._core = core
        self.path = socket_path.with_name(socket_path.name + layout.HANDOFF_SUFFIX)
        self._submitter = submitter or Submitter()
        self._offers: dict[str, _Offer] = {}
        self._by_client: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

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
        self._submitter.start()
        self._thread = threading.Thread(target=self._accept, name="accyd-ring-handoff", daemon=True)
        self._thread.start()

    def offer(self, client_id: str, slots: int = 0) -> RingOffer:
        """Make a ring for ``client_id``; it goes live once the client takes it."""
        if self._closing or self._listener is None:
            raise Unavailable("the daemon is not offering rings now")
        slots = slots or DEFAULT_SLOTS
        if slots > MAX_SLOTS or slots & (slots - 1):
            raise InvalidRequest(
                f"slots must be a power of two up to {MAX_SLOTS}, not {slots}", field="slots"
            )
        memory = RingMemory(slots)
        ring = ServerRing(new_id("ring"), client_id, memory, self._core)
        ticket = secrets.token_bytes(layout.TICKET_BYTES)
        with self._lock:
            self._expire()
            self._offers[ring.id] = _Offer(ring, ticket, time.monotonic() + OFFER_SECONDS)
            self._by_client.setdefault(client_id, set()).add(ring.id)
        return RingOffer(ring.id, ticket, self.path.name, slots)

    def close_client(self, client_id: str, timeout: float = 5.0) -> None:
        """Close every ring of a client that detached; returns once they are closed."""
        with self._lock:
            ring_ids = self._by_client.pop(client_id, set())
            offered = [self._offers.pop(r) for r in ring_ids if r in self._offers]
        for offer in offered:
            offer.ring.close()
        live = [r for r in ring_ids if all(o.ring.id != r for o in offered)]
        events = []
        for ring_id in live:
            done = threading.Event()
            self._submitter.remove(ring_id, done)
            events.append(done)
        for done in events:
            done.wait(timeout)

    def close(self) -> None:
        """Stop taking rings and close them all; removes only our own handoff socket."""
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
            self._by_client.clear()
        for offer in offers:
            offer.ring.close()
        self._submitter.stop()

    # Handoff ------------------------------------------------------------------------

    def _expire(self) -> None:
        now = time.monotonic()
        for ring_id in [r for r, o in self._offers.items() if o.expires < now]:
            offer = self._offers.pop(ring_id)
            self._by_client.get(offer.ring.client_id, set()).discard(ring_id)
            offer.ring.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closing:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                with self._lock:
                    self._expire()
                continue
            except OSError:
                return
            with conn:
                try:
                    self._hand_over(conn)
                except OSError as error:
                    log.info("ring handoff failed", error=str(error))

    def _hand_over(self, conn: socket.socket) -> None:
        conn.settimeout(2.0)
        hello = b""
        while len(hello) < _HELLO:
            part = conn.recv(_HELLO - len(hello))
            if not part:
                return
            hello += part
        ring_id = hello[:64].rstrip(b"\0").decode("ascii", "replace")
        ticket = hello[64:]
        with self._lock:
            offer = self._offers.get(ring_id)
            good = offer is not None and hmac.compare_digest(offer.ticket, ticket)
            if offer is not None and good:
                del self._offers[ring_id]
                # Live before the client hears of it, and under the lock, so a close_client
                # that follows is queued after this add and finds the ring.
                self._submitter.add(offer.ring)
        if offer is None or not good:
            conn.sendall(b"\x00")
            log.info("ring handoff refused", ring_id=ring_id[:64])
            return
        try:
            socket.send_fds(conn, [b"\x01"], offer.ring.memory.fds())
        except OSError:
            self._submitter.remove(ring_id)
            raise
        log.info("ring opened", ring_id=ring_id, client_id=offer.ring.client_id)
