"""Unguessable, prefixed ids for clients, sessions, buffers, launches, requests and instances."""

from __future__ import annotations

import secrets

__all__ = ["BUFFER", "CLIENT", "INSTANCE", "LAUNCH", "REQUEST", "SESSION", "new_id"]

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
