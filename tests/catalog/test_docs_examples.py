"""docs/catalog.md shows what the tests run: each manifest table in it is, field for field,
the table of the same target in a catalog a test loads."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "catalog.md"
SOURCES = [*(ROOT / "tests" / "catalogs").rglob("*.toml"), ROOT / "bench" / "triton_catalog.toml"]


def _tables() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in SOURCES:
        data = tomllib.loads(path.read_text())
        for kind in ("kernel", "pipeline"):
            for table in data.get(kind, []):
                found[f"{kind} {table['target']}"] = table
    return found


def test_every_manifest_example_is_a_tested_table() -> None:
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.S)
    tested = _tables()
    shown = 0
    for block in blocks:
        if "[ ... ]" in block:
            continue  # an outline (the nvcc example), not a manifest
        data = tomllib.loads(block)
        for kind in ("kernel", "pipeline"):
            for table in data.get(kind, []):
                key = f"{kind} {table['target']}"
                assert key in tested, f"docs/catalog.md shows {key}, which no test catalog has"
                assert table == tested[key], f"docs/catalog.md's {key} differs from the tested one"
                shown += 1
    assert shown >= 4
