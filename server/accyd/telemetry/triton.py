"""The KServe door's per-model figures under Triton's metric names, for dashboards made for it.

Triton exports cumulative counts and microseconds per model and version with no ``_total``
suffix (``nv_inference_request_success``, ``nv_inference_queue_duration_us``...); Prometheus'
Python client adds one to every counter, so these are exposed as untyped samples of exactly
Triton's names, which ``rate()`` and ``increase()`` read as they read Triton's. The numbers
are the ones ``ModelStatistics`` reports, summed over tenants.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

__all__ = ["TRITON_NAMES", "TritonFigures"]

TRITON_NAMES = {
    "nv_inference_request_success": "Successful inference requests, all batch sizes.",
    "nv_inference_request_failure": "Failed inference requests, all batch sizes.",
    "nv_inference_count": "Inferences performed (a request here is one inference).",
    "nv_inference_exec_count": "Model executions performed.",
    "nv_inference_request_duration_us": "Cumulative inference request duration in µs.",
    "nv_inference_queue_duration_us": "Cumulative inference queuing duration in µs.",
    "nv_inference_compute_input_duration_us": "Cumulative compute input duration in µs.",
    "nv_inference_compute_infer_duration_us": "Cumulative compute inference duration in µs.",
    "nv_inference_compute_output_duration_us": "Cumulative compute output duration in µs.",
}
"""Each figure's name and help, in the order of a model's row."""

_SUCCESS, _FAILURE, _COUNT, _EXEC, _REQUEST, _QUEUE, _INPUT, _INFER, _OUTPUT = range(9)


class TritonFigures:
    """A collector of the per-model figures; the door adds each request's outcome."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # scrapes come from the metrics server's thread
        self._rows: dict[tuple[str, str], list[float]] = {}

    def _row(self, model: str, version: int) -> list[float]:
        key = (model, str(version))
        row = self._rows.get(key)
        if row is None:  # models are the catalog's: the table stays small
            row = self._rows[key] = [0.0] * len(TRITON_NAMES)
        return row

    def succeeded(
        self, model: str, version: int, *, request_ns: int, queue_ns: int, input_ns: int,
        infer_ns: int, output_ns: int,
    ) -> None:  # fmt: skip
        """One request answered, with the time of each phase in ns."""
        with self._lock:
            row = self._row(model, version)
            row[_SUCCESS] += 1
            row[_COUNT] += 1
            row[_EXEC] += 1
            row[_REQUEST] += request_ns / 1000
            row[_QUEUE] += queue_ns / 1000
            row[_INPUT] += input_ns / 1000
            row[_INFER] += infer_ns / 1000
            row[_OUTPUT] += output_ns / 1000

    def failed(self, model: str, version: int) -> None:
        """One request refused or failed."""
        with self._lock:
            self._row(model, version)[_FAILURE] += 1

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [(key, list(row)) for key, row in self._rows.items()]
        for index, (name, documentation) in enumerate(TRITON_NAMES.items()):
            metric = Metric(name, documentation, "unknown")
            for (model, version), row in rows:
                value = row[index] if index < _REQUEST else int(row[index])
                metric.add_sample(name, {"model": model, "version": version}, value)
            yield metric
