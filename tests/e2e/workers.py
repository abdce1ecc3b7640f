"""What one client process does in the multi-process tests and the benchmark (spawn imports it)."""

from __future__ import annotations

import numpy as np

from accy import Client, references

SCAN = "accy.kernel.device_scan"


def scan_round_trip(target: str, seed: int, repeats: int = 3) -> tuple[int, str | None]:
    """Own session and buffers: scan fresh data ``repeats`` times; returns (seed, error or None)."""
    try:
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 50_000))
        with Client(target, client_name=f"worker-{seed}") as client:
            reference = references.find(SCAN)
            assert reference is not None
            with (
                client.load(SCAN) as session,
                client.empty(n, "f32") as x,
                client.empty(n, "f32") as y,
            ):
                for _ in range(repeats):
                    data = rng.random(n, dtype=np.float32)
                    x.write(data)
                    session.launch([x], [y], n=n)
                    (check,) = references.compare(reference, [data], [y.read()], {"n": n})
                    if not check.ok:
                        return seed, f"n={n}: relative error {check.error} > {check.tolerance}"
        return seed, None
    except Exception as error:  # reported to the parent, which fails the test with it
        return seed, f"{type(error).__name__}: {error}"
