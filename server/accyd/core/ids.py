"""Unguessable, prefixed ids for clients, sessions, buffers, launches, requests and instances."""

from __future__ import annotations

import itertools
import secrets

__all__ = [
    "BUFFER",
    "CLIENT",
    "INSTANCE",
    "LAUNCH",
    "REQUEST",
    "SESSION",
    "new_id",
    "new_request_id",
]

CLIENT = "cli"
SESSION = "ses"
BUFFER = "buf"
LAUNCH = "lau"
REQUEST = "req"
INSTANCE = "ins"

_SECRET_BYTES = 18
"""144 random bits: ids cannot be guessed, so naming one proves it was handed out."""


def new_id(prefix: str, nbytes: int = _SECRET_BYTES) -> str:
    """A fresh id such as ``ses_3q0v...``; the token alphabet is URL-safe base64 (no dots)."""
    return f"{prefix}_{secrets.token_urlsafe(nbytes)}"


_REQUESTS = itertools.count(1)
_PROCESS_TAG = secrets.token_urlsafe(6)


def new_request_id() -> str:
    """A request id for logs and error details: unique, cheap, and needing no secrecy."""
    return f"{REQUEST}_{_PROCESS_TAG}.{next(_REQUESTS):x}"
