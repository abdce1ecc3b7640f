"""Compile Triton-lang kernels with Triton's own compiler into an accy catalog folder.

    python bench/triton_catalog.py OUT_DIR [--arch 90]

Needs the ``triton`` package, not a GPU: ``triton.compile`` with a ``GPUTarget`` writes
the cubin and the metadata JSON that a ``format = "triton"`` kernel names, and this
script writes them beside a manifest (``triton.toml``) declaring four pipelines: a vector
add, a fused row softmax, a layer norm, and an fp16 matmul whose tiles take over 48 KiB
of shared memory. docs/catalog.md walks through the same steps for one kernel.
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, cols, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(in_ptr + row * cols + offsets, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * cols + offsets, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def layernorm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, cols, eps, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / cols
    d = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)
    w = tl.load(w_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets, mask=mask)
    tl.store(y_ptr + row * cols + offsets, d * rstd * w + b, mask=mask)


@triton.jit
def matmul_kernel(  # type: ignore[no-untyped-def]
    a_ptr, b_ptr, c_ptr, M, N, K,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * K + rk[None, :]
    b = b_ptr + rk[:, None] * N + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a_tile = tl.load(a, mask=(rm[:, None] < M) & (rk[None, :] + k < K), other=0.0)
        b_tile = tl.load(b, mask=(rk[:, None] + k < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a_tile, b_tile)
        a += BK
        b += BK * N
    c = c_ptr + rm[:, None] * N + rn[None, :]
    tl.store(c, acc.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


KERNELS: list[dict[str, Any]] = [
    {
        "fn": add_kernel,
        "signature": {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"},
        "constexprs": {"BLOCK": 1024},
        "options": {"num_warps": 4},
    },
    {
        "fn": softmax_kernel,
        "signature": {"out_ptr": "*fp32", "in_ptr": "*fp32", "cols": "i32"},
        "constexprs": {"BLOCK": 1024},
        "options": {"num_warps": 4},
    },
    {
        "fn": layernorm_kernel,
        "signature": {
            "x_ptr": "*fp32",
            "y_ptr": "*fp32",
            "w_ptr": "*fp32",
            "b_ptr": "*fp32",
            "cols": "i32",
            "eps": "fp32",
        },
        "constexprs": {"BLOCK": 1024},
        "options": {"num_warps": 4},
    },
    {
        "fn": matmul_kernel,
        "signature": {
            "a_ptr": "*fp16",
            "b_ptr": "*fp16",
            "c_ptr": "*fp16",
            "M": "i32",
            "N": "i32",
            "K": "i32",
        },
        "constexprs": {"BM": 128, "BN": 256, "BK": 128},
        "options": {"num_warps": 8, "num_stages": 4},
    },
]

MANIFEST = Path(__file__).with_suffix(".toml")
"""The manifest written beside the kernels (``$version``, ``$arch`` and ``$shared`` filled in)."""


def build(out: Path, arch: int) -> dict[str, dict[str, Any]]:
    """Compile every kernel for ``arch`` into ``out``; return each one's metadata."""
    out.mkdir(parents=True, exist_ok=True)
    found = {}
    for spec in KERNELS:
        source = ASTSource(
            fn=spec["fn"],
            signature={**spec["signature"], **dict.fromkeys(spec["constexprs"], "constexpr")},
            constexprs=spec["constexprs"],
        )
        kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=spec["options"])
        metadata = json.loads(json.dumps(kernel.metadata._asdict(), default=_plain))
        name = metadata["name"]
        (out / f"{name}.cubin").write_bytes(kernel.asm["cubin"])
        (out / f"{name}.json").write_text(json.dumps(metadata, indent=1))
        found[name] = metadata
    shared = found["matmul_kernel"]["shared"]
    text = string.Template(MANIFEST.read_text())
    (out / "triton.toml").write_text(
        text.substitute(version=triton.__version__, arch=arch, shared=shared)
    )
    return found


def _plain(value: Any) -> Any:
    """The JSON Triton writes for its own types (``GPUTarget`` as an object)."""
    if hasattr(value, "_asdict"):
        return value._asdict()
    if hasattr(value, "__dict__"):
        return vars(value)
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args()
    for name, metadata in build(args.out, args.arch).items():
        print(f"{name}: num_warps={metadata['num_warps']} shared={metadata['shared']}")


if __name__ == "__main__":
    main()
