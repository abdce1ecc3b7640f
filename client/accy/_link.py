"""One attachment of a client to a daemon, and what became of it when it was lost."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accy._attach import AttachStream
from accy._launches import CLOSE_DRAIN_SECONDS, LaunchStream
from accy._models import Attachment
from accy.errors import AccyError, NotFound, Unavailable
from accy.protocol import CLIENT_UNKNOWN, DEVICE_LOST, DEVICE_SCOPE

if TYPE_CHECKING:
    from accy._ring_path import RingPath

__all__ = ["DEVICE_LOST", "Link", "device_lost", "device_replaced", "names_client"]


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
    launches: LaunchStream | None = None
    """The link's LaunchStream, opened by the first launch on it."""
    ring: RingPath | None = None
    """The link's same-host ring, opened by the first launch on a local daemon."""
    ring_tried: bool = False
    shm: object | None = None
    """The link's shared-memory pool (``accy._shm.SharedPool``), made by the first large
    transfer to a local daemon."""
    shm_tried: bool = False

    def close_launches(self, *, now: bool = False) -> None:
        """End the link's LaunchStream: at once, or once lost, after answers on their way.

        Launches still waiting on a lost link raise why the link went; ``now``
        (the client is closing) cancels them, once launches sent without
        waiting were answered (enqueued), for up to ``CLOSE_DRAIN_SECONDS``.
        """
        if self.ring is not None and now:  # a lost link's ring stays readable: its
            # error entries say why its last work failed
            self.ring.close(CLOSE_DRAIN_SECONDS if self.lost is None else 0.0)
        if self.launches is None:
            return
        if now and self.lost is None:  # the client is closing: answers on their way count
            self.launches.close(CLOSE_DRAIN_SECONDS)
        elif now or self.lost is None:
            self.launches.close()
        else:
            self.launches.abandon(lambda: self.lost_error("a launch in flight"))

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
