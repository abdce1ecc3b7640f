"""The README's Python example runs as written against a real daemon."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accy.testing import running_daemon

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README lost its Python example"
    with running_daemon(backend="host", tcp=False) as daemon:
        monkeypatch.setenv("ACCY_TARGET", daemon.unix_target)
        namespace: dict[str, object] = {}
        exec(compile(blocks[0], str(README), "exec"), namespace)
    assert namespace["y"].shape == (1_000_000,)  # type: ignore[attr-defined]
    assert float(namespace["total"][0]) > 0  # type: ignore[index]


def test_readme_asyncio_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    (example,) = [block for block in blocks if "accy.aio" in block]
    with running_daemon(backend="host", tcp=False) as daemon:
        monkeypatch.setenv("ACCY_TARGET", daemon.unix_target)
        namespace: dict[str, object] = {}
        exec(compile(example, str(README), "exec"), namespace)
    assert len(namespace["results"]) == 8  # type: ignore[arg-type]
