"""Client-given text bounded before an error or a log line echoes it back.

A name of 10 MB in a request must not become a 10 MB error (the client then
gets "metadata size exceeds hard limit" instead of the error) or a 20 MB log
line. ``clip`` shortens one value; ``clip_words`` shortens every overlong word
of a message that some layer built with a name in it, and ``bounded`` caps a
whole text: the service applies them to every error it sends, the logs to
every value they write.
"""

from __future__ import annotations

import re

__all__ = ["ECHO_CHARS", "MESSAGE_CHARS", "bounded", "clip", "clip_words"]

ECHO_CHARS = 64
"""How much of a client-given value an error or a log line repeats."""
MESSAGE_CHARS = 2048
"""The longest error message or log value sent or written as it is."""

_LONG_WORD = re.compile(rf"\S{{{ECHO_CHARS + 1},}}")


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def clip_words(text: str) -> str:
    """``text`` with each word past ``ECHO_CHARS`` clipped; short texts stay whole."""
    if len(text) <= MESSAGE_CHARS:
        return text
    return _LONG_WORD.sub(lambda match: clip(match.group()), text)


def bounded(text: str) -> str:
    """``text`` at most about ``MESSAGE_CHARS`` long: long words clipped first, then the end."""
    return clip(clip_words(text), MESSAGE_CHARS)
