"""A launch on a LaunchStream waiting for its answer: waited for, or sent without waiting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accy.errors import AccyError
from accy.protocol.launch.v1 import launch_pb2 as pb

if TYPE_CHECKING:
    from accy._launches import LaunchStream

__all__ = ["Sent", "Waiter"]


class Waiter:
    """One launch waiting for its answer."""

    __slots__ = ("answer", "deadline", "error")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.answer: pb.LaunchResponse | None = None
        self.error: AccyError | None = None

    @property
    def done(self) -> bool:
        return self.answer is not None or self.error is not None


class Sent(Waiter):
    """A launch sent without waiting: its answer (launch id, or refusal) comes later.

    A refusal is reported once: by ``LaunchStream.answer`` for it, else by the
    next launch or settle of its session on the stream.
    """

    __slots__ = ("reported", "session_id", "stream", "tag")

    def __init__(self, stream: LaunchStream, tag: int, session_id: str) -> None:
        super().__init__(None)
        self.stream = stream
        self.tag = tag
        self.session_id = session_id
        self.reported = False

    def name(self) -> str:
        """How errors name this launch."""
        return f"launch #{self.tag} of session {self.session_id} (sent without waiting)"
