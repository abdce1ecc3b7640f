"""One attachment of a client to a daemon, and what became of it when it was lost."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from accy._attach import AttachStream
from accy._models import Attachment
from accy._seam import Transport
from accy.errors import AccyError, NotFound, Unavailable
from accy.protocol import CLIENT_UNKNOWN, DEVICE_LOST, DEVICE_SCOPE

__all__ = ["DEVICE_LOST", "Link", "device_lost", "device_replaced", "lost_of", "names_client"]


def device_lost(error: AccyError) -> bool:
    """Whether ``error`` says the daemon lost its device (it is about to restart)."""
    return (
        isinstance(error, Unavailable)
        and error.reason == DEVICE_LOST
        and error.metadata.get("scope") != DEVICE_SCOPE
    )


def device_replaced(error: AccyError, device: int | None = None) -> bool:
    """Whether ``error`` says one device (``device``, if given) was lost and replaced while
    the daemon lives on: what was on it must be loaded or written again."""
    return (
        isinstance(error, Unavailable)
        and error.reason == DEVICE_LOST
        and error.metadata.get("scope") == DEVICE_SCOPE
        and (device is None or error.metadata.get("device") == str(device))
    )


def names_client(error: AccyError) -> bool:
    """Whether ``error`` says the daemon does not know this client (it restarted or detached it)."""
    return isinstance(error, NotFound) and error.reason == CLIENT_UNKNOWN


@dataclass(eq=False)
class Link:
    """The client's ids on one daemon instance: valid until ``lost`` says why they are not.

    Sessions are loaded again on the next link; buffers made on a lost link
    stay lost (their ``buffers`` set counts them for the report).
    """

    generation: int
    stream: AttachStream
    metadata: tuple[tuple[str, str], ...]
    lost: str | None = None
    """Why the link was lost, to follow "was lost when": "the daemon restarted"..."""
    reason: str | None = None
    """The same as a stable code: DEVICE_LOST, DAEMON_RESTARTED, DETACHED or DISCONNECTED."""
    fault_session: str | None = None
    lost_at: float = 0.0
    buffers: weakref.WeakSet[object] = field(default_factory=weakref.WeakSet)
    transport: Transport = field(init=False)
    """How the link's launches and bytes travel (``accy._link_transport.open_transport``)."""

    @property
    def attachment(self) -> Attachment:
        return self.stream.attachment

    def lose(self, error: AccyError, now: float) -> None:
        """Note why the link was lost, from the error that showed it.

        The first error counts, except that a device fault, learnt later (the
        stream ended first), replaces a plainer reason.
        """
        if self.lost is not None and (self.reason == DEVICE_LOST or not device_lost(error)):
            return
        if not self.lost_at:
            self.lost_at = now
        if device_lost(error):
            session = error.metadata.get("session")
            where = f" in session {session}" if session else ""
            self.lost, self.reason, self.fault_session = (
                f"the daemon lost its device to a fault{where}",
                DEVICE_LOST,
                session,
            )
        elif names_client(error) or error.reason == "DETACHED":
            self.lost, self.reason = "the daemon detached this client", "DETACHED"
        else:
            self.lost, self.reason = "the connection to the daemon broke", "DISCONNECTED"

    def restarted(self) -> None:
        """The next attachment found a new daemon instance: say so (a fault already does)."""
        if self.reason != DEVICE_LOST:
            self.lost, self.reason = "the daemon restarted", "DAEMON_RESTARTED"

    def lost_error(self, what: str) -> Unavailable:
        """The error for work of ``what`` (a launch) that this lost link took with it."""
        return Unavailable(
            f"{what} was lost when {self.lost}; launch it again",
            reason=self.reason,
            metadata={"session": self.fault_session} if self.fault_session else {},
        )


def lost_of(link: Link) -> Callable[[], bool]:
    """A check of whether ``link`` is lost (or gone) that holds it weakly. A ring and stream are
    closed by finalizers of the ``RingLaunches`` that owns them, and what a finalizer's
    callback holds must not lead back to its object: a lambda over ``link`` (which owns
    the transport, which owns the ``RingLaunches``) kept every closed client's objects,
    its stream's memory descriptor included, for the life of the process."""
    held = weakref.ref(link)

    def lost() -> bool:
        now = held()
        return now is None or now.lost is not None

    return lost
