"""ModelStatistics: real counts and times per tenant, model and version.

Each request adds its outcome: success or failure with its whole duration, and
for a success the time spent waiting for a session and buffers (queue),
moving inputs in (compute_input), running the pipeline (compute_infer) and
moving outputs out (compute_output). A tenant sees only its own numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.telemetry.triton import TritonFigures

__all__ = ["Phases", "Statistics"]


@dataclass(slots=True)
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def proto(self) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=self.count, ns=self.ns)


@dataclass(slots=True)
class Phases:
    """When one request passed each phase (``time.perf_counter_ns``)."""

    started: int = field(default_factory=time.perf_counter_ns)
    ready: int = 0
    """Session and buffers in hand."""
    written: int = 0
    computed: int = 0
    answered: int = 0


@dataclass(slots=True)
class _Model:
    success: _Duration = field(default_factory=_Duration)
    fail: _Duration = field(default_factory=_Duration)
    queue: _Duration = field(default_factory=_Duration)
    compute_input: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    compute_output: _Duration = field(default_factory=_Duration)
    last_inference_ms: int = 0


class Statistics:
    """Per (tenant, model, version) numbers, for the models the catalog has."""

    def __init__(self, figures: TritonFigures | None = None) -> None:
        self._models: dict[tuple[str, str, int], _Model] = {}
        self._figures = figures or TritonFigures()  # the same outcomes, under Triton's names

    def _of(self, tenant: str, name: str, version: int) -> _Model:
        key = (tenant, name, version)
        found = self._models.get(key)
        if found is None:
            found = self._models[key] = _Model()
        return found

    def succeeded(self, tenant: str, name: str, version: int, phases: Phases) -> None:
        model = self._of(tenant, name, version)
        model.success.add(phases.answered - phases.started)
        model.queue.add(phases.ready - phases.started)
        model.compute_input.add(phases.written - phases.ready)
        model.compute_infer.add(phases.computed - phases.written)
        model.compute_output.add(phases.answered - phases.computed)
        model.last_inference_ms = time.time_ns() // 1_000_000
        self._figures.succeeded(
            name, version, request_ns=phases.answered - phases.started,
            queue_ns=phases.ready - phases.started, input_ns=phases.written - phases.ready,
            infer_ns=phases.computed - phases.written, output_ns=phases.answered - phases.computed,
        )  # fmt: skip

    def failed(self, tenant: str, name: str, version: int, phases: Phases) -> None:
        model = self._of(tenant, name, version)
        model.fail.add(time.perf_counter_ns() - phases.started)
        model.last_inference_ms = time.time_ns() // 1_000_000
        self._figures.failed(name, version)

    def proto(self, tenant: str, name: str, version: int) -> pb.ModelStatistics:
        """The tenant's numbers for one model version (zeros before its first request)."""
        model = self._models.get((tenant, name, version)) or _Model()
        count = model.success.count
        return pb.ModelStatistics(
            name=name,
            version=str(version),
            last_inference=model.last_inference_ms,
            inference_count=count,
            execution_count=count,
            inference_stats=pb.InferStatistics(
                success=model.success.proto(),
                fail=model.fail.proto(),
                queue=model.queue.proto(),
                compute_input=model.compute_input.proto(),
                compute_infer=model.compute_infer.proto(),
                compute_output=model.compute_output.proto(),
                cache_hit=pb.StatisticDuration(),
                cache_miss=pb.StatisticDuration(),
            ),
            batch_stats=(
                [
                    pb.InferBatchStatistics(
                        batch_size=1,
                        compute_input=model.compute_input.proto(),
                        compute_infer=model.compute_infer.proto(),
                        compute_output=model.compute_output.proto(),
                    )
                ]
                if count
                else []
            ),
        )
