"""structlog setup: console for people, JSON for machines; ids bound per call via contextvars."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

__all__ = ["bind", "configure_logging", "unbind"]

bind = structlog.contextvars.bind_contextvars
unbind = structlog.contextvars.reset_contextvars


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
