"""Catalog manifests: the built-in catalog loads; errors name the file, the entry and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from accyd.catalog import ArtifactFormat, DType, Scalar, load_catalog
from accyd.catalog.expr import Arg, CeilDiv
from accyd.errors import CatalogError, NotFound

KERNEL = """
[[kernel]]
target = "demo.kernel.copy"
version = 1
format = "host_py"
entry = "copy"
code = "def copy(grid, block, buffers, scalars):\\n    buffers[0][:] = buffers[1]\\n"
buffers = 2
scalars = [{ name = "n", dtype = "u32" }]
grid = ["ceil_div(n, 256)"]
block = [256]
"""

PIPELINE = """
[[pipeline]]
target = "demo.copy"
version = 1
scalars = [{ name = "n", dtype = "u32", min = 1, max = 1024 }]
operands = [{ name = "x", dtype = "u8", extent = "n" }]
results = [{ name = "y", dtype = "u8", extent = "n" }]

[[pipeline.stage]]
kernel = "demo.kernel.copy"
version = 1
buffers = ["y", "x"]
scalars = ["n"]
"""


def write(tmp_path: Path, text: str, name: str = "demo.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return tmp_path


def test_builtin_catalog_has_the_three_pipelines_in_host_format() -> None:
    catalog = load_catalog()
    targets = {p.target for p in catalog.pipelines}
    assert {"accy.kernel.device_scan", "accy.kernel.reduce_sum", "accy.kernel.saxpy"} <= targets
    scan = catalog.find_pipeline("accy.kernel.device_scan")
    assert ArtifactFormat.HOST_PY in catalog.formats_of(scan)
    assert scan.runtime_scalar_bounds[0].max_value >= 2**30
    assert [s.target for s in scan.stages] == ["accy.kernel.scan.single_pass"]
    state, partials = scan.intermediates
    assert (state.dtype, state.zeroed, partials.zeroed) == (DType.U64, True, False)
    assert [spec.element_count([Scalar.u32(8193)]) for spec in scan.intermediates] == [3, 4]
    reduce = catalog.find_pipeline("accy.kernel.reduce_sum")
    assert reduce.intermediates[0].extent == CeilDiv(Arg(0), 4096)
    assert not reduce.intermediates[0].zeroed


def test_operator_catalog_loads_beside_the_builtin_one(tmp_path: Path) -> None:
    catalog = load_catalog([write(tmp_path, KERNEL + PIPELINE)])
    pipeline = catalog.find_pipeline("demo.copy")
    assert catalog.formats_of(pipeline) == (ArtifactFormat.HOST_PY,)
    assert catalog.find_pipeline("demo.copy", 1) is pipeline
    assert catalog.find_pipeline("accy.kernel.saxpy").target == "accy.kernel.saxpy"


def test_unknown_pipeline_is_not_found() -> None:
    with pytest.raises(NotFound, match="no pipeline nope"):
        load_catalog().find_pipeline("nope")
    with pytest.raises(NotFound, match="v9"):
        load_catalog().find_pipeline("accy.kernel.saxpy", 9)


@pytest.mark.parametrize(
    ("text", "entry", "field", "problem"),
    [
        (
            KERNEL.replace('format = "host_py"', 'format = "wasm"'),
            "kernel 'demo.kernel.copy'",
            "format",
            "unknown format 'wasm'",
        ),
        (
            KERNEL.replace("buffers = 2", 'buffers = "two"'),
            "kernel 'demo.kernel.copy'",
            "buffers",
            "must be int",
        ),
        (
            KERNEL.replace('dtype = "u32"', 'dtype = "f24"'),
            "kernel 'demo.kernel.copy'",
            "scalars[0].dtype",
            "unknown dtype 'f24'",
        ),
        (
            KERNEL.replace('"ceil_div(n, 256)"', '"ceil_div(m, 256)"'),
            "kernel 'demo.kernel.copy'",
            "grid[0]",
            "names 'm'",
        ),
        (
            KERNEL.replace('"ceil_div(n, 256)"', '"ceil_div(n, 0)"'),
            "kernel 'demo.kernel.copy'",
            "grid[0]",
            "divides by 0",
        ),
        (
            KERNEL.replace('"ceil_div(n, 256)"', '"n ** 2"'),
            "kernel 'demo.kernel.copy'",
            "grid[0]",
            "expressions may use",
        ),
        (
            KERNEL.replace("version = 1\n", "version = 0\n", 1),
            "kernel 'demo.kernel.copy'",
            "version",
            "1 or more",
        ),
        (
            KERNEL.replace("block = [256]", "block = [256]\nthreads = 3"),
            "kernel 'demo.kernel.copy'",
            "threads",
            "not a known field",
        ),
        (
            KERNEL.replace('entry = "copy"\n', ""),
            "kernel 'demo.kernel.copy'",
            "entry",
            "is required",
        ),
        (
            KERNEL.replace("code = ", 'source = "missing.cu"\ncode = '),
            "kernel 'demo.kernel.copy'",
            "source",
            "exactly one",
        ),
        (
            KERNEL.replace('code = "def', 'source = "missing.py"\n#').replace('\\n"\n', "\n", 1),
            "kernel 'demo.kernel.copy'",
            "source",
            "cannot read",
        ),
        (
            PIPELINE.replace('buffers = ["y", "x"]', 'buffers = ["y", "z"]'),
            "pipeline 'demo.copy'",
            "stage[0].buffers[1]",
            "'z' is no buffer",
        ),
        (
            PIPELINE.replace('extent = "n" }]\nresults', 'extent = "n * k" }]\nresults'),
            "pipeline 'demo.copy'",
            "operands[0].extent",
            "names 'k'",
        ),
        (
            PIPELINE.replace("min = 1, max = 1024", "min = 1"),
            "pipeline 'demo.copy'",
            "scalars[0].max",
            "needs a 'max'",
        ),
        (
            PIPELINE.replace("max = 1024", "max = 5000000000"),
            "pipeline 'demo.copy'",
            "scalars[0].max",
            "does not fit u32",
        ),
        (
            PIPELINE.replace('name = "y"', 'name = "x"'),
            "pipeline 'demo.copy'",
            "results[0].name",
            "names two things",
        ),
        (
            PIPELINE.replace('extent = "n" }]\nresults', 'extent = "n", zeroed = true }]\nresults'),
            "pipeline 'demo.copy'",
            "operands[0].zeroed",
            "not a known field",
        ),
        (
            PIPELINE.replace(
                "\n\n[[pipeline.stage]]",
                '\nintermediates = [{ name = "s", dtype = "u64", extent = "2", zeroed = 1 }]'
                "\n\n[[pipeline.stage]]",
            ),
            "pipeline 'demo.copy'",
            "intermediates[0].zeroed",
            "must be bool, not int",
        ),
    ],
)
def test_manifest_errors_name_file_entry_and_field(
    tmp_path: Path, text: str, entry: str, field: str, problem: str
) -> None:
    body = text if text.lstrip().startswith("[[pipeline]]") is False else KERNEL + text
    folder = write(tmp_path, body)
    with pytest.raises(CatalogError) as caught:
        load_catalog([folder], builtin=False)
    message = str(caught.value)
    assert str(tmp_path / "demo.toml") in message
    assert entry in message
    assert repr(field) in message
    assert problem in message
    assert caught.value.field == field


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    folder = write(tmp_path, "[[kernel]\n")
    with pytest.raises(CatalogError, match=r"demo\.toml: not valid TOML"):
        load_catalog([folder], builtin=False)


def test_pipeline_whose_stage_has_no_kernel_in_any_format_is_refused(tmp_path: Path) -> None:
    folder = write(tmp_path, PIPELINE)
    with pytest.raises(
        CatalogError, match=r"demo\.copy.*no artifact format has a kernel.*demo\.kernel\.copy v1"
    ):
        load_catalog([folder], builtin=False)


def test_stage_binding_the_wrong_number_of_buffers_is_refused(tmp_path: Path) -> None:
    folder = write(tmp_path, KERNEL + PIPELINE.replace('buffers = ["y", "x"]', 'buffers = ["y"]'))
    with pytest.raises(CatalogError, match="binds 1 buffers; the kernel takes 2"):
        load_catalog([folder], builtin=False)


def test_stage_passing_the_wrong_scalar_type_is_refused(tmp_path: Path) -> None:
    text = KERNEL + PIPELINE.replace(
        '{ name = "n", dtype = "u32", min = 1, max = 1024 }',
        '{ name = "n", dtype = "u32", min = 1, max = 1024 }, { name = "a", dtype = "f32" }',
    ).replace('scalars = ["n"]', 'scalars = ["a"]')
    with pytest.raises(CatalogError, match=r"types \['f32'\]; the kernel takes \['u32'\]"):
        load_catalog([write(tmp_path, text)], builtin=False)


def test_duplicate_definitions_name_both_files(tmp_path: Path) -> None:
    write(tmp_path, KERNEL, "a.toml")
    write(tmp_path, KERNEL, "b.toml")
    with pytest.raises(CatalogError, match=r"defined twice: .*a\.toml.*b\.toml"):
        load_catalog([tmp_path], builtin=False)


def test_missing_catalog_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        load_catalog([tmp_path / "nope"])
