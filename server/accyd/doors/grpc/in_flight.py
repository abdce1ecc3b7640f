"""The admitted calls running now, so a stop or a tokens reload can end them, saying why.

Each call admitted (``accyd.doors.grpc.admission``) is here while it runs,
with what admitted it: its context, the scopes its method needs and its
principal. Ending one cancels its task; its wrapper then answers the caller with
the error given (``ended``) instead of a bare cancellation. ``end_all`` ends every
call the drain ends (not the Attach streams: a stop closes those itself, after
the rings settled); ``end_where`` ends the calls a tokens reload no longer admits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from accyd.core.ids import new_request_id
from accyd.doors.grpc.calls import log_failure
from accyd.doors.grpc.status import to_status
from accyd.errors import AccyError
from accyd.tokens import Principal

__all__ = ["ANSWER_SECONDS", "Admitted", "InFlight"]

ANSWER_SECONDS = 2.0
"""How long the calls a stop ended may take to be answered before gRPC cancels the rest."""

Context = grpc.aio.ServicerContext[Any, Any]


class Admitted:
    """One call in flight and what admitted it."""

    __slots__ = ("context", "drained", "principal", "scopes")

    def __init__(
        self,
        context: Context,
        scopes: tuple[str, ...],
        principal: Principal | None,
        drained: bool,
    ) -> None:
        self.context = context
        self.scopes = scopes
        self.principal = principal
        self.drained = drained
        """Whether the drain ends it (``end_all``)."""


class InFlight:
    """The admitted calls running now."""

    def __init__(self) -> None:
        self._calls: dict[asyncio.Task[Any], Admitted] = {}
        self._endings: dict[asyncio.Task[Any], AccyError] = {}
        self._none = asyncio.Event()
        self._none.set()
        self.ending: AccyError | None = None
        """The drain's error, once ``end_all`` ran."""

    def __len__(self) -> int:
        return len(self._calls)

    def enter(
        self,
        context: Context,
        scopes: tuple[str, ...],
        principal: Principal | None,
        drained: bool = True,
    ) -> asyncio.Task[Any]:
        """Count the running call in; give what it returns to ``leave`` once it is over."""
        task = asyncio.current_task()
        assert task is not None
        self._calls[task] = Admitted(context, scopes, principal, drained)
        self._none.clear()
        return task

    def leave(self, task: asyncio.Task[Any]) -> None:
        self._calls.pop(task, None)
        self._endings.pop(task, None)
        if not self._calls:
            self._none.set()

    def end_all(self, error: AccyError) -> int:
        """Answer every call the drain ends with ``error`` (once: a second cancel would cut
        the first one's answer short); returns how many there were."""
        if self.ending is not None:
            return 0
        self.ending = error
        ended = 0
        for task, call in self._calls.items():
            if call.drained and task not in self._endings:
                task.cancel()
                ended += 1
        return ended

    def end_where(self, refusal: Callable[[Admitted], AccyError | None]) -> int:
        """Answer each call ``refusal`` finds an error for with that error; how many."""
        ended = 0
        for task, call in list(self._calls.items()):
            if task in self._endings or (self.ending is not None and call.drained):
                continue  # being ended already
            error = refusal(call)
            if error is not None:
                self._endings[task] = error
                task.cancel()
                ended += 1
        return ended

    async def wait_none(self, timeout: float) -> bool:
        """Wait until no call is in flight (those ended answered), for at most ``timeout``."""
        try:
            await asyncio.wait_for(self._none.wait(), max(timeout, 0.0))
        except TimeoutError:
            return False
        return True

    async def cancel_rest(self, server: grpc.aio.Server, at: float) -> None:
        """At loop time ``at``, once the calls ended by then are answered (or
        ``ANSWER_SECONDS`` more passed), have gRPC cancel the calls it still runs: those
        nobody admitted (health, reflection)."""
        await asyncio.sleep(at - asyncio.get_running_loop().time())
        await self.wait_none(ANSWER_SECONDS)
        await server.stop(None)

    async def ended(self, context: Context, task: asyncio.Task[Any]) -> None:
        """Abort a call this ended with its error; re-raise any other cancellation."""
        error = self._endings.get(task)
        call = self._calls.get(task)
        if error is None and call is not None and call.drained:
            error = self.ending
        if error is None:
            raise asyncio.CancelledError
        request_id = new_request_id()
        log_failure("call", error, request_id=request_id)
        status = to_status(error, request_id)
        await context.abort(status.code, status.details, status.trailing_metadata)
