"""structlog setup: console for people, JSON for machines; ids bound per call via contextvars.

A call's own ids (request, rpc, client, tenant) are bound lazily: the call sets
one context variable to an object that names them (``bind_lazily``), and the
``lazy_fields`` processor reads them only when a line is logged. Binding each
with ``bind`` costs every call a few context variables set and reset, most of
them for calls that log nothing. Values bound with ``bind``, and a line's own,
take precedence over lazy ones.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Mapping
from typing import Protocol, TextIO

import structlog

from accyd.clipping import MESSAGE_CHARS, bounded
from accyd.log_limits import ClientLines

__all__ = [
    "Fields",
    "LazyToken",
    "LogFields",
    "bind",
    "bind_lazily",
    "bound_values",
    "client_lines",
    "configure_logging",
    "debug_enabled",
    "flush_left_out",
    "lazy_fields",
    "unbind",
    "unbind_lazily",
]

bind = structlog.contextvars.bind_contextvars
unbind = structlog.contextvars.reset_contextvars


class LogFields(Protocol):
    """Something that names fields of every line logged while it is bound."""

    def log_fields(self, event: structlog.typing.EventDict) -> None:
        """Add its fields to ``event`` where the line has none of that name (``setdefault``)."""


class Fields:
    """Fixed fields, to bind lazily (made once, bound per call)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, object]) -> None:
        self._values = dict(values)

    def log_fields(self, event: structlog.typing.EventDict) -> None:
        for key, value in self._values.items():
            event.setdefault(key, value)


_lazy: contextvars.ContextVar[tuple[LogFields, ...]] = contextvars.ContextVar(
    "accyd_lazy_log_fields", default=()
)
_debug = True
"""Whether debug lines are logged (structlog's default until ``configure_logging`` says)."""

LazyToken = contextvars.Token[tuple[LogFields, ...]]

client_lines = ClientLines()
"""The per-client bound on log lines (``accyd.log_limits``) that
``configure_logging`` installs."""


def flush_left_out() -> None:
    """Write the summaries of lines left out so far (at shutdown)."""
    client_lines.flush()


def bind_lazily(source: LogFields) -> LazyToken:
    """Name ``source``'s fields on every line logged in this context from now on."""
    return _lazy.set((*_lazy.get(), source))


def unbind_lazily(token: LazyToken) -> None:
    """Undo one ``bind_lazily`` (and any made after it)."""
    _lazy.reset(token)


def lazy_fields(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Add the fields of the sources bound lazily: the latest bound first."""
    for source in reversed(_lazy.get()):
        source.log_fields(event)
    return event


def debug_enabled() -> bool:
    """Whether debug lines are logged: a line whose fields cost to compute checks first."""
    return _debug


def bound_values(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Bound every text value of a log line: any of them may repeat what a client sent."""
    for key, value in event.items():
        if isinstance(value, str) and len(value) > MESSAGE_CHARS:
            event[key] = bounded(value)
    return event


def configure_logging(
    log_format: str = "console",
    level: str = "info",
    stream: TextIO | None = None,
    *,
    stdlib: bool = False,
) -> None:
    """Route every structlog logger to ``stream`` (stderr) as ``console`` or ``json`` lines.

    ``stdlib``: hand each rendered line to the standard ``logging`` logger of its name
    instead (``accyd.doors.grpc``...), where a host process's handlers take it (pytest's
    capture, an embedding application's own logging)."""
    global _debug
    number = logging.getLevelNamesMapping().get(level.upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r}")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        lazy_fields,
        client_lines,
        bound_values,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if log_format == "json":
        processors.append(structlog.processors.format_exc_info)
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=(
            structlog.stdlib.LoggerFactory()
            if stdlib
            # one write per line, newline included: a supervisor and its server share
            # one stderr, which PYTHONUNBUFFERED (the image sets it) leaves unbuffered,
            # and print's two writes let another process's line land between them
            else structlog.WriteLoggerFactory(stream or sys.stderr)
        ),
        cache_logger_on_first_use=True,  # a proxy re-binding per call costs every RPC
    )
    _debug = number <= logging.DEBUG
