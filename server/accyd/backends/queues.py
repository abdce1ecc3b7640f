"""CUDA's hardware work queues per context (``CUDA_DEVICE_MAX_CONNECTIONS``), set before any.

A CUDA context feeds the device through a fixed number of hardware queues, 8 unless
``CUDA_DEVICE_MAX_CONNECTIONS`` says otherwise when the context is made (at most 32).
Streams beyond that share queues, and work on two streams sharing one serializes
falsely: 32 sessions' streams on 8 queues ran at most about 8 long kernels at once. The
daemon sets it (``--cuda-max-connections``, 16 by default) in its own environment before
any backend is made, so its device workers inherit it; a worker sets it again (the same
rule) before its own backend. A value the operator put in the environment is kept.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["DEFAULT_QUEUES", "MAX_CONNECTIONS_ENV", "set_work_queues"]

MAX_CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
DEFAULT_QUEUES = 16
"""Measured on an H100 (16 CPUs), 32 clients of the sharing kernel, one run per count:
8 queues ran waited 46.7 µs kernels fastest (280k/s) but those pipelined 16 deep at 185k/s
(MPS: 350k); 32 queues pipelined 439k/s but waited 249k/s, and cost 8 waited clients of
an 8 µs kernel 9% (304k against 330k/s at 8 queues; their p50 24.6 against 22.7 µs); 16
queues: 272k waited, 359k pipelined, 320k for the 8 clients (bench/scale.py,
bench/ab_trees.py)."""


def set_work_queues(
    count: int = DEFAULT_QUEUES, environ: MutableMapping[str, str] | None = None
) -> tuple[str, bool]:
    """Put ``count`` in ``CUDA_DEVICE_MAX_CONNECTIONS`` unless it is set already; the value
    in effect and whether it was the environment's own (kept)."""
    env = os.environ if environ is None else environ
    own = env.get(MAX_CONNECTIONS_ENV, "").strip()
    if own:
        return own, True
    env[MAX_CONNECTIONS_ENV] = str(count)
    return str(count), False
