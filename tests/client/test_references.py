"""The numpy references behind ``accy run --check``: right answers, compared in chunks."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from accy import references

SCAN, SUM, SAXPY = "accy.kernel.device_scan", "accy.kernel.reduce_sum", "accy.kernel.saxpy"


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_chunked_checks_agree_with_whole_array_ones(chunk: int) -> None:
    rng = np.random.default_rng(3)
    n = 1000
    x, y = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    cases = {
        SCAN: ([x], [np.cumsum(x, dtype=np.float64).astype(np.float32)], {"n": n}),
        SUM: ([x], [np.array([x.sum(dtype=np.float64)], np.float32)], {"n": n}),
        SAXPY: ([x, y], [(2.5 * x + y).astype(np.float32)], {"n": n, "a": 2.5}),
    }
    for target, (operands, results, scalars) in cases.items():
        reference = references.find(target)
        assert reference is not None
        (good,) = references.compare(reference, operands, results, scalars, chunk=chunk)
        whole = references.relative_l2(results[0], reference.compute(operands, scalars)[0])
        assert good.ok and good.error == pytest.approx(whole, rel=1e-6, abs=1e-12), target
        wrong = [r.copy() for r in results]
        wrong[0][-1] += 1.0
        (bad,) = references.compare(reference, operands, wrong, scalars, chunk=chunk)
        assert not bad.ok, target
        (short,) = references.compare(reference, operands, [r[:0] for r in results], scalars)
        assert short.error == float("inf")


def test_checking_a_large_result_takes_little_memory() -> None:
    n = 8 << 20  # 32 MiB of f32 in, 32 MiB out
    x = np.ones(n, np.float32)
    y = np.arange(1, n + 1, dtype=np.float32)
    reference = references.find(SCAN)
    assert reference is not None
    tracemalloc.start()
    try:
        (check,) = references.compare(reference, [x], [y], {"n": n})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert check.ok
    # A whole-array check made float64 copies of operand, reference and difference: 200+ MiB.
    assert peak < 8 * references.CHUNK * 8, f"peak {peak >> 20} MiB"
