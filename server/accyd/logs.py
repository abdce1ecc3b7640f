"""structlog setup: console for people, JSON for machines; ids bound per call via contextvars."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from accyd.echo import MESSAGE_CHARS, bounded

__all__ = ["bind", "bound_values", "configure_logging", "unbind"]

bind = structlog.contextvars.bind_contextvars
unbind = structlog.contextvars.reset_contextvars


def bound_values(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Bound every text value of a log line: any of them may repeat what a client sent."""
    for key, value in event.items():
        if isinstance(value, str) and len(value) > MESSAGE_CHARS:
            event[key] = bounded(value)
    return event


def configure_logging(
    log_format: str = "console", level: str = "info", stream: TextIO | None = None
) -> None:
    """Route every structlog logger to ``stream`` (stderr) as ``console`` or ``json`` lines."""
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
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=True,  # a proxy re-binding per call costs every RPC
    )
