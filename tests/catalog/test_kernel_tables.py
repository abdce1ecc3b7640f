"""Kernel tables as users write them: parameters in any order, Triton's metadata, CUDA
sources with headers and options, per-architecture images, stage geometry, shapes, the
new expressions, and the refusals that name file, entry and field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.entries import ParamKind
from accyd.catalog.expr import extent_of, parse
from accyd.catalog.sources import check_options
from accyd.errors import CatalogError, InvalidArtifact

FIXTURES = Path(__file__).parents[1] / "catalogs"

KERNEL = """
[[kernel]]
target = "k"
version = 1
format = "cuda_cpp"
source = "k.cu"
entry = "k"
params = [{ scalar = "n", dtype = "u32" }, { buffer = "x" }, { null = "unused" }, { buffer = "y" }]
grid = ["ceil_div(n, 256)"]
block = [256]
"""

PIPELINE = """
[[pipeline]]
target = "p"
version = 1
scalars = [
  { name = "rows", dtype = "u32", min = 1, max = 4096 },
  { name = "cols", dtype = "u32", max = 4096 },
]
operands = [{ name = "x", dtype = "f16", shape = ["rows", "cols"] }]
results = [{ name = "y", dtype = "bf16", shape = ["cols", "rows"] }]
[[pipeline.stage]]
kernel = "k"
version = 1
buffers = ["x", "y"]
scalars = ["rows * cols"]
grid = ["rows", "ceil_div(cols, 32)"]
block = ["min(cols, 256)"]
shared_memory_bytes = "cols * 2"
"""


def folder_with(tmp_path: Path, text: str, source: str = "__global__ void k() {}") -> Path:
    (tmp_path / "k.cu").write_text(source)
    (tmp_path / "m.toml").write_text(text)
    return tmp_path


def refused(tmp_path: Path, text: str, field: str, says: str, source: str = "") -> None:
    folder = folder_with(tmp_path, text, source or '#include "common.cuh"\n')
    with pytest.raises(CatalogError) as caught:
        load_catalog([folder], builtin=False)
    assert str(tmp_path / "m.toml") in caught.value.message
    assert repr(field) in caught.value.message
    assert says in caught.value.message


def test_parameters_in_the_kernels_order(tmp_path: Path) -> None:
    catalog = load_catalog([folder_with(tmp_path, KERNEL + PIPELINE)], builtin=False)
    (entry,) = catalog.registry.entries
    assert [p.kind for p in entry.layout()] == [
        ParamKind.SCALAR, ParamKind.BUFFER, ParamKind.NULL, ParamKind.BUFFER,
    ]  # fmt: skip
    assert [p.size for p in entry.layout()] == [4, 8, 8, 8]
    assert (entry.buffer_argument_count(), entry.scalar_argument_count()) == (2, 1)


def test_stage_geometry_and_shapes_over_the_pipelines_scalars(tmp_path: Path) -> None:
    catalog = load_catalog([folder_with(tmp_path, KERNEL + PIPELINE)], builtin=False)
    pipeline = catalog.find_pipeline("p", 1)
    (entry,) = catalog.registry.entries
    args = [Scalar.u32(5), Scalar.u32(300)]
    geometry, shared = pipeline.stages[0].launch_geometry(entry, [Scalar.u32(1500)], args)
    assert geometry.grid == (5, 10, 1) and geometry.block == (256, 1, 1) and shared == 600
    assert pipeline.results[0].dims(args) == (300, 5)
    assert pipeline.operands[0].byte_size(args) == 5 * 300 * 2


def test_the_triton_fixture_is_laid_out_with_its_hidden_pointers() -> None:
    catalog = load_catalog([FIXTURES / "triton_add"], builtin=False)
    (entry,) = catalog.registry.entries
    assert entry.entry_name == "add_kernel" and entry.arch == 90
    assert entry.launch.block == (128, 1, 1)  # 32 x num_warps
    assert [(p.kind, p.name) for p in entry.layout()][3:] == [
        (ParamKind.SCALAR, "n"),
        (ParamKind.NULL, "global_scratch"),
        (ParamKind.NULL, "profile_scratch"),
    ]
    assert entry.payload[:4] == b"\x7fELF"


def _triton_copy(tmp_path: Path, **changes: object) -> Path:
    shutil.copytree(FIXTURES / "triton_add", tmp_path / "t")
    metadata = tmp_path / "t" / "add_kernel.json"
    data = json.loads(metadata.read_text())
    data.update(changes)
    metadata.write_text(json.dumps(data))
    return tmp_path / "t"


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"num_ctas": 2}, "num_ctas is above 1"),
        ({"global_scratch_size": 64}, "64 bytes of global scratch per program"),
        ({"target": {"backend": "hip", "arch": "gfx942"}}, "built for 'hip'"),
        ({"num_warps": 0}, "num_warps is 0"),
        ({"name": 7}, "names no kernel"),
    ],
)
def test_triton_metadata_accy_cannot_launch_is_refused(
    tmp_path: Path, changes: dict[str, object], says: str
) -> None:
    with pytest.raises(CatalogError, match=says) as caught:
        load_catalog([_triton_copy(tmp_path, **changes)], builtin=False)
    assert "field 'metadata'" in caught.value.message


def test_a_triton_entry_or_block_must_agree_with_its_metadata(tmp_path: Path) -> None:
    folder = _triton_copy(tmp_path)
    manifest = folder / "triton.toml"
    manifest.write_text(
        manifest.read_text().replace('format = "triton"', 'format = "triton"\nblock = [256]')
    )
    with pytest.raises(CatalogError, match="Triton's metadata says \\(128, 1, 1\\)"):
        load_catalog([folder], builtin=False)


def test_headers_beside_the_manifest_travel_with_the_source(tmp_path: Path) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "common.cuh").write_text('#include "inc/more.cuh"\n#include <cuda_fp16.h>\n')
    (tmp_path / "inc" / "more.cuh").write_text("#define MORE 1\n")
    catalog = load_catalog(
        [folder_with(tmp_path, KERNEL, '#include "common.cuh"\n__global__ void k() {}')],
        builtin=False,
    )
    (entry,) = catalog.registry.entries
    assert [name for name, _ in entry.headers] == ["common.cuh", "inc/more.cuh"]


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ('entry = "k"', "params", "not both"),
        ('params = [{ scalar = "n", dtype = "u32" }', "params[0].dtype", "cannot be a scalar"),
        ('params = [{ scalar = "n", dtype = "u32" }', "params[0]", "is one of"),
        ("block = [256]", "options", "is not allowed"),
        ('format = "cuda_cpp"', "options", "only a cuda_cpp kernel"),
        ('grid = ["ceil_div(n, 256)"]', "grid", "must be 1.."),
        ('grid = ["ceil_div(n, 256)"]', "grid[0]", "divides by 0"),
        ('grid = ["ceil_div(n, 256)"]', "grid[0]", "at most 512 characters"),
        ('source = "k.cu"', "source", "outside the manifest's folder"),
    ],
)
def test_kernel_mistakes_are_refused_naming_the_field(
    tmp_path: Path, change: str, field: str, says: str
) -> None:
    replacement = {
        "not both": 'entry = "k"\nbuffers = 2',
        "cannot be a scalar": 'params = [{ scalar = "n", dtype = "bf16" }',
        "is one of": 'params = [{ tensor = "n" }',
        "is not allowed": 'block = [256]\noptions = ["-I/etc"]',
        "only a cuda_cpp kernel": 'format = "cuda_ptx"\noptions = ["-DX=1"]',
        "must be 1..": "grid = [4294967295]",
        "divides by 0": 'grid = ["n / 0"]',
        "at most 512 characters": 'grid = ["' + " * ".join(["n"] * 200) + '"]',
        "outside the manifest's folder": 'source = "k.cu"',
    }[says]
    source = '#include "../../etc/passwd"\n' if "outside" in says else ""
    refused(tmp_path, KERNEL.replace(change, replacement, 1), field, says, source)


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ('{ name = "rows", dtype = "u32", min = 1, max = 4096 }',
         "scalars[0].min", "min 10 is above max 5"),
        ('shape = ["rows", "cols"]', "operands[0].extent", "exactly one of"),
        ('shape = ["rows", "cols"]', "operands[0].shape[1]", "0 is outside 1.."),
        ('shape = ["rows", "cols"]', "operands[0].shape", "overflows"),
        ('{ name = "rows", dtype = "u32", min = 1, max = 4096 }',
         "scalars[0].dtype", "cannot be a runtime scalar"),
    ],
)  # fmt: skip
def test_pipeline_mistakes_are_refused_at_start(
    tmp_path: Path, change: str, field: str, says: str
) -> None:
    replacement = {
        "min 10 is above max 5": '{ name = "rows", dtype = "u32", min = 10, max = 5 }',
        "exactly one of": 'shape = ["rows", "cols"], extent = "rows"',
        "0 is outside 1..": 'shape = ["rows", 0]',
        "overflows": "shape = [4294967295, 4294967295, 4294967295]",
        "cannot be a runtime scalar": '{ name = "rows", dtype = "bool" }',
    }[says]
    refused(tmp_path, KERNEL + PIPELINE.replace(change, replacement, 1), field, says)


def test_per_architecture_images(tmp_path: Path) -> None:
    (tmp_path / "a.cubin").write_bytes(b"\x7fELF90")
    (tmp_path / "b.cubin").write_bytes(b"\x7fELF80")
    text = KERNEL.replace('format = "cuda_cpp"', 'format = "cuda_cubin"').replace(
        'source = "k.cu"', 'images = { sm_90 = "a.cubin", sm_80 = "b.cubin" }'
    )
    (entry,) = load_catalog([folder_with(tmp_path, text)], builtin=False).registry.entries
    assert entry.images == ((80, b"\x7fELF80"), (90, b"\x7fELF90"))
    bad = text.replace("sm_80", "gfx90")
    refused(tmp_path, bad, "images.gfx90", "keys are architectures")


def test_options_allow_list() -> None:
    allowed = ["-DTILE=64", "--use_fast_math", "--maxrregcount=64", "-std=c++20", "--ftz=true"]
    assert check_options(allowed) == tuple(allowed)
    for refused_option in ("-I/tmp", "--gpu-architecture=sm_90", "--pre-include=x.h", "-G -DX"):
        with pytest.raises(ValueError, match="is not allowed"):
            check_options([refused_option])


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [
        ("n / 2", [7], 3),
        ("n - 1", [7], 6),
        ("min(n, 4) + max(n, 4)", [7], 11),
        ("ceil_div(n, m)", [7, 2], 4),
        ("(n + m) * 2", [7, 2], 18),
    ],
)
def test_new_expressions_evaluate(text: str, values: list[int], expected: int) -> None:
    expr = parse(text, {"n": 0, "m": 1})
    assert extent_of(expr, [Scalar.u32(v) for v in values]) == expected
    assert parse(str(expr), {"n": 0, "m": 1}) == expr  # messages print what parses back


@pytest.mark.parametrize(
    ("text", "values", "says"),
    [
        ("n - m", [1, 2], "is negative"),
        ("n / m", [1, 0], r"divides by 0 \(m is 0\)"),
        ("n * n * n * n * n", [2**32 - 1], "overflows"),
    ],
)
def test_expressions_refuse_before_anything_runs(text: str, values: list[int], says: str) -> None:
    expr = parse(text, {"n": 0, "m": 1})
    with pytest.raises(InvalidArtifact, match=says):
        extent_of(expr, [Scalar.u32(v) for v in values])


def test_expression_messages_name_the_scalars() -> None:
    expr = parse("ceil_div(rows * cols, 32)", {"rows": 0, "cols": 1})
    assert str(expr) == "ceil_div(rows * cols, 32)"
    with pytest.raises(InvalidArtifact, match="rows - cols is negative"):
        extent_of(parse("rows - cols", {"rows": 0, "cols": 1}), [Scalar.u32(1), Scalar.u32(2)])
    assert DType.F16.is_scalar and not DType.BF16.is_scalar
