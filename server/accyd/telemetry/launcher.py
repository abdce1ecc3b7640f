"""The device launcher's figures for ``/metrics``: its own counts and where a launch's time goes.

They are read from the launcher's counters at each scrape (``DeviceLauncher.stats``: one small
copy from device memory), so they cost nothing between scrapes. The launches it made are in
``accy_launches_total`` too, by pipeline; these say what only the launcher knows: records it
left to the CPU path, launches the device refused, its runs and relaunches, and the mean
time of each step of a launch it made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

__all__ = ["LauncherFigures"]

_COUNTS = {
    "launched": ("accy_device_launcher_launches", "Graphs the device launcher launched."),
    "left": (
        "accy_device_launcher_left",
        "Records the device launcher left to the CPU path (no live ticket, a stale one, or a "
        "launch the device refused).",
    ),
    "errors": ("accy_device_launcher_launch_errors", "Device graph launches that failed."),
    "runs": ("accy_device_launcher_runs", "Runs of the launcher's instances."),
    "relaunches": ("accy_device_launcher_relaunches", "Instances the host started again."),
}
_STEPS = {"round": "round_ns", "look": "look_ns", "launch": "launch_ns", "graph": "graph_ns"}
"""Each step's label and its ``stats()`` key: an instance's round over every ring, and for a
launch made the look before its launch call, the call, and the graph after it."""


class LauncherFigures:
    """A collector of one device launcher's figures, read from ``stats`` at each scrape; an
    empty mapping (no launcher, or it closed) shows nothing."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        return []  # the samples depend on a launcher being there: not described ahead

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self._stats()
        except Exception:  # a lost device: its own figures say so, and a scrape still answers
            return
        if not stats:
            return
        for key, (name, help_text) in _COUNTS.items():
            counter = CounterMetricFamily(name, help_text)
            counter.add_metric([], float(stats.get(key, 0)))
            yield counter
        rings = GaugeMetricFamily("accy_device_launcher_rings", "Rings the launcher serves now.")
        rings.add_metric([], float(stats.get("served_rings", 0)))
        yield rings
        steps = GaugeMetricFamily(
            "accy_device_launcher_step_seconds",
            "Mean time of a step, since the launcher started: an instance's round over every "
            "ring; for a launch made, its look, its launch call and its graph until it ended.",
            labels=["step"],
        )
        for label, key in _STEPS.items():
            steps.add_metric([label], stats.get(key, 0) / 1e9)
        yield steps
