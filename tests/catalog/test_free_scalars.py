"""Which runtime scalars no check reads (``Pipeline.free_scalars``): the ones a checked launch
could be replayed with another value of."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from accyd.catalog import ArtifactFormat, load_catalog

KERNEL = """
[[kernel]]
target = "demo.kernel.scale"
version = 1
format = "host_py"
entry = "scale"
code = "def scale(grid, block, buffers, scalars):\\n    pass\\n"
buffers = 2
scalars = [
  { name = "n", dtype = "u32" }, { name = "k", dtype = "u32" }, { name = "a", dtype = "f32" },
]
grid = ["ceil_div(n, 256)", "k"]
block = [256]
"""


def pipeline(scalars: str, stage_scalars: str, extra: str = "", extent: str = "n") -> str:
    return f"""
[[pipeline]]
target = "demo.scale"
version = 1
scalars = [{scalars}]
operands = [{{ name = "x", dtype = "f32", extent = "{extent}" }}]
results = [{{ name = "y", dtype = "f32", extent = "{extent}" }}]

[[pipeline.stage]]
kernel = "demo.kernel.scale"
version = 1
buffers = ["y", "x"]
scalars = [{stage_scalars}]
{extra}
"""


UNBOUNDED = (
    '{ name = "n", dtype = "u32" }, { name = "k", dtype = "u32" }, { name = "b", dtype = "f32" }, '
)


def free(tmp_path: Path, text: str) -> set[str]:
    (tmp_path / "demo.toml").write_text(textwrap.dedent(KERNEL + text))
    catalog = load_catalog([tmp_path])
    found = catalog.find_pipeline("demo.scale")
    indices = found.free_scalars(catalog.registry, ArtifactFormat.HOST_PY)
    return {found.runtime_scalars[i].name for i in indices}


def test_the_builtin_pipelines() -> None:
    catalog = load_catalog()
    names = {}
    for target in ("accy.kernel.saxpy", "accy.kernel.device_scan", "accy.kernel.reduce_sum"):
        found = catalog.find_pipeline(target)
        indices = found.free_scalars(catalog.registry, ArtifactFormat.HOST_PY)
        names[target] = {found.runtime_scalars[i].name for i in indices}
    # saxpy's a is only multiplied in; n sizes the buffers and the grid
    assert names == {
        "accy.kernel.saxpy": {"a"},
        "accy.kernel.device_scan": set(),
        "accy.kernel.reduce_sum": set(),
    }


def test_a_scalar_passed_through_and_read_by_nothing_is_free(tmp_path: Path) -> None:
    text = pipeline(UNBOUNDED + '{ name = "a", dtype = "f32" }', '"n", "k", "a"')
    # n: an extent and the launch rule's; k: the launch rule's grid; b: passed to no kernel
    assert free(tmp_path, text) == {"a", "b"}


@pytest.mark.parametrize(
    ("scalars", "stage_scalars", "extra", "why"),
    [
        ('{ name = "a", dtype = "f32", min = -1.0, max = 1.0 }', '"n", "k", "a"', "", "bounds"),
        ('{ name = "a", dtype = "u32" }', '"n", "ceil_div(a, 2)", "b"', "", "a derived scalar"),
        ('{ name = "a", dtype = "u32" }', '"n", "a", "b"', "", "the launch rule"),
        ('{ name = "a", dtype = "u32" }', '"n", "k", "b"', 'grid = ["a", 1, 1]', "a geometry"),
    ],
)
def test_a_scalar_some_check_reads_is_not_free(
    tmp_path: Path, scalars: str, stage_scalars: str, extra: str, why: str
) -> None:
    text = pipeline(UNBOUNDED + scalars, stage_scalars, extra)
    assert "a" not in free(tmp_path, text), why


def test_a_scalar_in_an_extent_is_not_free(tmp_path: Path) -> None:
    text = pipeline(UNBOUNDED + '{ name = "a", dtype = "u32" }', '"n", "k", "b"', "", "n + a")
    assert free(tmp_path, text) == {"b"}
