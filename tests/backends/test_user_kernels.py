"""Kernels nobody wrote for accy, registered as they are and launched through a real daemon.

CUDA C++ with CUDA's headers (fp16, bf16, CUB, cooperative groups, wmma, a template by
name expression), Triton-lang kernels compiled here by Triton's own compiler, and a cubin
from nvcc: each checked against numpy through the one-call path and through the ring,
and each with a wrong manifest (a parameter missing, one too many, a size wrong) refused
at load naming the kernel and the parameter. Needs a GPU; the Triton and nvcc parts need
``triton`` and ``nvcc`` too.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import accy
from accy.errors import FailedPrecondition
from accy.testing import RunningDaemon, running_daemon
from accyd.backends.cuda import cuda_available

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

USER = Path(__file__).parents[1] / "catalogs" / "user_kernels"
RNG = np.random.default_rng(7)

WRONG = """
[[kernel]]
target = "wrong.{name}"
version = 1
format = "{format}"
source = "{source}"
{entry}
params = [{params}]
grid = [1]
{block}

[[pipeline]]
target = "wrong.{name}"
version = 1
scalars = [{pipeline_scalars}]
operands = [{operands}]
results = []
[[pipeline.stage]]
kernel = "wrong.{name}"
version = 1
buffers = [{buffers}]
scalars = [{scalars}]
"""


def _wrong(
    folder: Path, name: str, fmt: str, source: str, entry: str, params: list[str], block: str
) -> None:
    buffers = [p.split('"')[1] for p in params if "buffer" in p]
    scalars = [p.split('"')[1] for p in params if "scalar" in p]
    dtypes = [p.split('"')[3] for p in params if "scalar" in p]
    (folder / f"{name}.toml").write_text(
        WRONG.format(
            name=name,
            format=fmt,
            source=source,
            entry=f'entry = "{entry}"' if entry else "",
            params=", ".join(params),
            block=block,
            operands=", ".join(f'{{ name = "{b}", dtype = "u8", extent = "n" }}' for b in buffers),
            buffers=", ".join(f'"{b}"' for b in buffers),
            scalars=", ".join(f'"{name}"' for name in scalars),
            pipeline_scalars=", ".join(
                f'{{ name = "{name}", dtype = "{dtype}" }}'
                for name, dtype in zip(scalars, dtypes, strict=True)
            ),
        )
    )


def _triton(folder: Path) -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "triton_catalog", Path(__file__).parents[2] / "bench" / "triton_catalog.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(folder / "triton", 90)
    return True


def _nvcc(folder: Path) -> bool:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return False
    out = folder / "nvcc"
    out.mkdir()
    shutil.copy(USER / "kernels.cu", out)
    shutil.copy(USER / "common.cuh", out)
    subprocess.run(
        [nvcc, "-cubin", "-arch=sm_90", "-o", str(out / "kernels.sm_90.cubin"), "kernels.cu"],
        cwd=out,
        check=True,
    )
    subprocess.run(
        [nvcc, "-fatbin", "-gencode=arch=compute_80,code=sm_80",
         "-gencode=arch=compute_90,code=sm_90", "-o", str(out / "kernels.fatbin"), "kernels.cu"],
        cwd=out,
        check=True,
    )  # fmt: skip
    manifest = (USER / "user.toml").read_text().split("[[kernel]]")[1]
    for kind, payload in (
        ("cubin", 'images = { sm_90 = "kernels.sm_90.cubin" }'),
        ("fatbin", 'source = "kernels.fatbin"'),
    ):
        text = manifest.replace('format = "cuda_cpp"', 'format = "cuda_cubin"')
        text = text.replace('source = "kernels.cu"', payload)
        text = text.replace('options = ["-DUSER_KERNELS=1", "--use_fast_math"]\n', "")
        text = text.replace('"user.axpy_f16"', f'"nvcc.axpy_{kind}"')
        (out / f"{kind}.toml").write_text("[[kernel]]" + text)
    return True


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("user-catalog")
    shutil.copytree(USER, root / "user")
    found = {"root": root, "triton": _triton(root), "nvcc": _nvcc(root)}
    wrong = root / "wrong"
    wrong.mkdir()
    shutil.copy(USER / "kernels.cu", wrong)
    shutil.copy(USER / "common.cuh", wrong)
    axpy = ['{ scalar = "n", dtype = "u32" }', '{ scalar = "a", dtype = "f32" }',
            '{ buffer = "x" }', '{ buffer = "y" }', '{ buffer = "out" }']  # fmt: skip
    block = "block = [256]"
    _wrong(wrong, "axpy_missing", "cuda_cpp", "kernels.cu", "axpy_f16", axpy[:-1], block)
    _wrong(wrong, "axpy_extra", "cuda_cpp", "kernels.cu", "axpy_f16",
           [*axpy, '{ buffer = "more" }'], block)  # fmt: skip
    sized = [axpy[0].replace("u32", "u64"), *axpy[1:]]
    _wrong(wrong, "axpy_size", "cuda_cpp", "kernels.cu", "axpy_f16", sized, block)
    if found["triton"]:
        shutil.copy(root / "triton" / "add_kernel.cubin", wrong)
        shutil.copy(root / "triton" / "add_kernel.json", wrong)
        add = ['{ buffer = "x" }', '{ buffer = "y" }', '{ buffer = "out" }',
               '{ scalar = "n", dtype = "i32" }']  # fmt: skip
        _wrong(wrong, "add_missing", "triton", "add_kernel.cubin", "", add[1:], "")
        _wrong(wrong, "add_extra", "triton", "add_kernel.cubin", "",
               [*add, '{ buffer = "more" }'], "")  # fmt: skip
        sized = [*add[:3], add[3].replace("i32", "i64")]
        _wrong(wrong, "add_size", "triton", "add_kernel.cubin", "", sized, "")
    return found


@pytest.fixture(scope="module")
def daemon(catalog: dict[str, Any]) -> Iterator[RunningDaemon]:
    with running_daemon(
        backend="cuda", tcp=False, extra=["--catalog", str(catalog["root"])]
    ) as running:
        yield running


@pytest.fixture(params=["run", "ring"])
def launch(request: pytest.FixtureRequest, daemon: RunningDaemon) -> Iterator[Any]:
    """Runs a pipeline and returns its results: one ``Run`` call, or buffers and a waited
    ring launch."""
    with accy.Client(daemon.unix_target) as client:

        def through_ring(target: str, *operands: np.ndarray, **scalars: Any) -> list[np.ndarray]:
            info = client.pipeline(target)
            values = {**scalars}
            for spec, array in zip(info.operands, operands, strict=True):
                spec.default_scalars(array, values)
            ints = {k: int(v) for k, v in values.items() if float(v).is_integer()}
            with client.load(target) as session:
                ins = [client.buffer(a) for a in operands]
                outs = [client.empty(spec.dims(ints), spec.dtype) for spec in info.results]
                session.launch(operands=ins, results=outs, **values)
                got = [out.read() for out in outs]
                for buffer in ins + outs:
                    buffer.free()
                return got

        yield client.run if request.param == "run" else through_ring


def _close(got: np.ndarray, want: np.ndarray, tol: float) -> None:
    assert got.shape == want.shape
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    error = np.linalg.norm(got64 - want64) / max(np.linalg.norm(want64), 1e-30)
    assert error < tol, f"relative error {error}"


def test_fp16_axpy_with_scalars_first(launch: Any) -> None:
    x, y = (RNG.standard_normal(100_003).astype(np.float16) for _ in range(2))
    (out,) = launch("user.axpy_f16", x, y, n=x.size, a=1.5)
    _close(out, (1.5 * x.astype(np.float32) + y).astype(np.float16), 2e-3)


def test_bf16_arithmetic(launch: Any) -> None:
    x = RNG.standard_normal(4099).astype(ml_dtypes.bfloat16)
    (out,) = launch("user.scale_bf16", x, s=0.25)
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    _close(out, (x.astype(np.float32) * 1.25).astype(ml_dtypes.bfloat16), 1e-2)


def test_cub_block_reduce(launch: Any) -> None:
    x = RNG.standard_normal(65_000).astype(np.float32)
    (total,) = launch("user.sum", x)
    assert abs(float(total[0]) - float(x.astype(np.float64).sum())) < 1e-2


def test_cooperative_groups(launch: Any) -> None:
    x = RNG.standard_normal(32 * 1000).astype(np.float32)
    (sums,) = launch("user.warp_sums", x)
    _close(sums, x.reshape(-1, 32).sum(axis=1), 1e-5)


def test_wmma_tile_and_shapes(launch: Any) -> None:
    a = RNG.standard_normal((64, 48)).astype(np.float16)
    b = RNG.standard_normal((48, 80)).astype(np.float16)
    (c,) = launch("user.wmma_gemm", a, b)
    _close(c, a.astype(np.float32) @ b.astype(np.float32), 1e-3)


def test_template_by_name_expression(launch: Any) -> None:
    x = RNG.standard_normal(5000).astype(np.float32)
    (out,) = launch("user.scale_f32", x, s=3.0)
    _close(out, x * 3, 1e-6)


def test_triton_kernels(launch: Any, catalog: dict[str, Any]) -> None:
    if not catalog["triton"]:
        pytest.skip("triton is not installed here")
    x, y = (RNG.standard_normal(1_000_003).astype(np.float32) for _ in range(2))
    (out,) = launch("triton.vector_add", x, y)
    _close(out, x + y, 1e-6)
    m = RNG.standard_normal((300, 777)).astype(np.float32)
    (soft,) = launch("triton.softmax", m)
    e = np.exp(m - m.max(axis=1, keepdims=True))
    _close(soft, e / e.sum(axis=1, keepdims=True), 1e-5)
    w, bias = (
        RNG.standard_normal(777).astype(np.float32),
        RNG.standard_normal(777).astype(np.float32),
    )
    (norm,) = launch("triton.layernorm", m, w, bias, eps=1e-5)
    mean, var = m.mean(axis=1, keepdims=True), m.var(axis=1, keepdims=True)
    _close(norm, (m - mean) / np.sqrt(var + 1e-5) * w + bias, 1e-4)
    a = RNG.standard_normal((512, 384)).astype(np.float16)
    b = RNG.standard_normal((384, 640)).astype(np.float16)
    (c,) = launch("triton.matmul", a, b)
    _close(c, (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16), 2e-3)


def test_nvcc_cubin_and_fatbin(launch: Any, catalog: dict[str, Any]) -> None:
    if not catalog["nvcc"]:
        pytest.skip("nvcc is not installed here")
    x, y = (RNG.standard_normal(10_000).astype(np.float16) for _ in range(2))
    for kind in ("cubin", "fatbin"):
        (out,) = launch(f"nvcc.axpy_{kind}", x, y, n=x.size, a=-2.0)
        _close(out, (-2.0 * x.astype(np.float32) + y).astype(np.float16), 2e-3)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("axpy_missing", "takes 5 parameters; the manifest lists 4"),
        ("axpy_extra", "takes 5 parameters; the manifest lists 6"),
        ("axpy_size", "parameter 0 ('n', u64 scalar) is 8 bytes in the manifest"),
        ("add_missing", "takes 6 parameters; the manifest lists 5"),
        ("add_extra", "takes 6 parameters; the manifest lists 7"),
        ("add_size", "parameter 3 ('n', i64 scalar) is 8 bytes in the manifest"),
    ],
)
def test_a_wrong_manifest_is_refused_at_load(
    daemon: RunningDaemon, catalog: dict[str, Any], name: str, says: str
) -> None:
    if name.startswith("add") and not catalog["triton"]:
        pytest.skip("triton is not installed here")
    with accy.Client(daemon.unix_target) as client, pytest.raises(FailedPrecondition) as caught:
        client.load(f"wrong.{name}")
    assert says in str(caught.value)
    assert "kernel" in str(caught.value)


def _kserve(daemon: RunningDaemon, model: str, inputs: list[tuple[str, str, np.ndarray]],
            **parameters: float) -> Any:  # fmt: skip
    """One ModelInfer through the KServe door, raw tensors, as tritonclient sends them."""
    from accyd.doors.kserve.protocol import open_inference_pb2 as pb
    from tests.kserve.harness import Door

    request = pb.ModelInferRequest(model_name=model)
    for name, datatype, array in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    for name, value in parameters.items():
        request.parameters[name].double_param = value
    door = Door(daemon.unix_target)
    try:
        return door("ModelInfer", request)
    finally:
        door.close()


def test_through_the_kserve_door(daemon: RunningDaemon, catalog: dict[str, Any]) -> None:
    x, y = (RNG.standard_normal(4096).astype(np.float16) for _ in range(2))
    reply = _kserve(daemon, "user.axpy_f16", [("x", "FP16", x), ("y", "FP16", y)], a=2.0)
    assert reply.outputs[0].datatype == "FP16" and list(reply.outputs[0].shape) == [4096]
    out = np.frombuffer(reply.raw_output_contents[0], dtype=np.float16)
    _close(out, (2.0 * x.astype(np.float32) + y).astype(np.float16), 2e-3)
    a = RNG.standard_normal((32, 48)).astype(np.float16)
    b = RNG.standard_normal((48, 64)).astype(np.float16)
    reply = _kserve(daemon, "user.wmma_gemm", [("a", "FP16", a), ("b", "FP16", b)])
    assert list(reply.outputs[0].shape) == [32, 64]  # the pipeline's own dims
    c = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(32, 64)
    _close(c, a.astype(np.float32) @ b.astype(np.float32), 1e-3)
    if catalog["triton"]:
        m = RNG.standard_normal((10, 300)).astype(np.float32)
        reply = _kserve(daemon, "triton.softmax", [("x", "FP32", m)])
        soft = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(10, 300)
        e = np.exp(m - m.max(axis=1, keepdims=True))
        _close(soft, e / e.sum(axis=1, keepdims=True), 1e-5)
