"""Plain HTTP calls of the KServe HTTP door's tests (the standard library's client)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        assert self.headers.get("Content-Type", "").startswith("application/json"), self
        return json.loads(self.body)

    @property
    def error(self) -> str:
        """The refusal's message: ``{"error": ...}`` is the whole body."""
        body = self.json()
        assert set(body) == {"error"}, body
        assert isinstance(body["error"], str)
        return body["error"]


def call(
    base: str,
    path: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    token: str | None = None,
) -> Answer:
    """``GET`` (no body) or ``POST`` ``path``; any status is returned, not raised."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(base + path, data=data, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as error:
        return Answer(error.code, dict(error.headers), error.read())


def simple_inputs(a: list[int], b: list[int]) -> list[dict[str, Any]]:
    """The ``simple`` model's two inputs as JSON tensors."""
    return [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b},
    ]
