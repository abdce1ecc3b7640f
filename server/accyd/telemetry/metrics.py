"""Prometheus metrics of one daemon, in a registry of its own (no process-global state).

Beside the daemon's own (``accy_*``): the standard process and Python figures
(``process_resident_memory_bytes``, ``process_cpu_seconds_total``, ``process_open_fds``...,
``python_info``, ``python_gc_*``) and the KServe door's per-model figures under Triton's
names (``accyd.telemetry.triton``), and the device launcher's own where it serves rings
(``accyd.telemetry.launcher``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.metrics_core import Metric

from accyd.core.interface import UNKNOWN_PIPELINE
from accyd.errors import AccyError
from accyd.telemetry.launcher import LauncherFigures
from accyd.telemetry.triton import TritonFigures

if TYPE_CHECKING:
    from accyd.core.interface import DaemonStatus

__all__ = ["Metrics", "RingLaunchCounts", "status_of"]

SESSIONS_KEPT = 4096
"""Sessions whose pipeline ``RingLaunchCounts`` keeps; past this it starts over."""

_LATENCY_BUCKETS = (
    50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 0.1, 0.2, 0.5, 1.0,
    2.0, 5.0, 10.0,
)  # fmt: skip


class _BeforeScrape:
    """A collector of nothing that runs callbacks first, so gauges read live state at a scrape."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for callback in self.callbacks:
            callback()
        return iter(())


class Metrics:
    """Every metric the daemon exports; ``serve`` exposes them over HTTP on a port of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._before_scrape = _BeforeScrape()
        r.register(self._before_scrape)  # first: collectors run in the order registered
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.triton = TritonFigures()
        r.register(self.triton)
        self.launches = Counter(
            "accy_launches", "Pipeline launches by pipeline and status.", ["pipeline", "status"],
            registry=r,
        )  # fmt: skip
        self.launch_seconds = Histogram(
            "accy_launch_seconds", "Launch latency from request to completion or enqueue.",
            ["pipeline", "waited"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.clients = Gauge("accy_clients", "Attached clients.", registry=r)
        self.sessions = Gauge("accy_sessions", "Live sessions.", registry=r)
        self.buffers = Gauge("accy_buffers", "Live client buffers.", registry=r)
        self.memory = Gauge(
            "accy_device_memory_bytes", "Device memory held, by tenant.", ["tenant"], registry=r
        )
        self.shared_memory = Gauge(
            "accy_shared_memory_bytes", "Host memory shared with clients (segments, rings), "
            "by tenant.", ["tenant"], registry=r,
        )  # fmt: skip
        self.descriptors = Gauge(
            "accy_descriptors", "Descriptors the daemon holds for clients, by tenant.",
            ["tenant"], registry=r,
        )  # fmt: skip
        self.quota_refusals = Counter(
            "accy_quota_refusals", "Calls refused by a quota.", ["tenant", "quota"], registry=r
        )
        self.device_faults = Counter("accy_device_faults", "Sticky device faults.", registry=r)
        self.device_serving = Gauge(
            "accy_device_serving", "1 while the device takes work.", ["device"], registry=r
        )
        self.device_memory = Gauge(
            "accy_device_memory_in_use_bytes", "Memory the device's backend has allocated.",
            ["device"], registry=r,
        )  # fmt: skip
        self.device_sessions = Gauge(
            "accy_device_sessions", "Live sessions on the device.", ["device"], registry=r
        )
        self.device_replacements = Gauge(
            "accy_device_replacements", "Faults the device's worker was replaced after.",
            ["device"], registry=r,
        )  # fmt: skip
        self.partition_sms = Gauge(
            "accy_partition_sms", "SMs of the device's partition (tenants confined to them).",
            ["device", "partition"], registry=r,
        )  # fmt: skip
        self.partition_sessions = Gauge(
            "accy_partition_sessions", "Live sessions whose kernels run in the partition.",
            ["device", "partition"], registry=r,
        )  # fmt: skip
        self.device_unconfined = Gauge(
            "accy_device_partitions_unconfined", "1 where partitions were asked for and the "
            "device could not make them (its tenants run on all its SMs).", ["device"],
            registry=r,
        )  # fmt: skip
        self.restarts = Gauge(
            "accy_restarts", "Times the supervisor restarted the server process.", registry=r
        )
        self._server: WSGIServer | None = None
        self._launch_children: dict[tuple[str, str], Counter] = {}
        self._seconds_children: dict[tuple[str, bool], Histogram] = {}
        self._quota_children: dict[tuple[str, str], Counter] = {}

    def observe_launch(
        self, pipeline: str, seconds: float, *, waited: bool, error: BaseException | None = None
    ) -> None:
        """Count one launch (status ``ok``, or the error's reason in lower case) and its latency."""
        self.count_launches(pipeline, status_of(error), 1)
        if error is None:
            key = (pipeline, waited)
            child = self._seconds_children.get(key)
            if child is None:
                label = "true" if waited else "false"
                child = self._seconds_children[key] = self.launch_seconds.labels(pipeline, label)
            child.observe(seconds)

    def count_launches(self, pipeline: str, status: str, count: int) -> None:
        """Count ``count`` launches of one status (the rings' have no latency to observe)."""
        key = (pipeline, status)
        child = self._launch_children.get(key)
        if child is None:
            child = self._launch_children[key] = self.launches.labels(pipeline, status)
        child.inc(count)

    def quota_refused(self, tenant: str, quota: str) -> None:
        """Count one refusal; the labelled child is kept (``labels()`` costs µs a call)."""
        key = (tenant, quota)
        child = self._quota_children.get(key)
        if child is None:  # tenants and quotas are few: the dict stays small
            child = self._quota_children[key] = self.quota_refusals.labels(tenant, quota)
        child.inc()

    def watch(self, status: Callable[[], DaemonStatus]) -> None:
        """Read clients, sessions, buffers and memory per tenant from ``status`` at each scrape."""
        self._before_scrape.callbacks.append(lambda: self.show(status()))

    def watch_launcher(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        """Show the device launcher's figures (``accy_device_launcher_*``) from ``stats`` at
        each scrape; nothing while it returns an empty mapping."""
        self.registry.register(LauncherFigures(stats))

    def show(self, status: DaemonStatus) -> None:
        """Set the gauges from a daemon's status."""
        self.clients.set(status.clients)
        self.sessions.set(status.sessions)
        self.buffers.set(status.buffers)
        for tenant in status.tenants:
            self.memory.labels(tenant.name).set(tenant.usage.memory_bytes)
            self.shared_memory.labels(tenant.name).set(tenant.usage.host_memory_bytes)
            self.descriptors.labels(tenant.name).set(tenant.usage.descriptors)
        for device in status.devices:
            label = str(device.index)
            self.device_serving.labels(label).set(1 if device.serving else 0)
            self.device_memory.labels(label).set(device.memory_in_use)
            self.device_sessions.labels(label).set(device.sessions)
            self.device_replacements.labels(label).set(device.replacements)
            self.device_unconfined.labels(label).set(1 if device.unconfined else 0)
            for partition in device.partitions:
                self.partition_sms.labels(label, partition.name).set(partition.sms)
                self.partition_sessions.labels(label, partition.name).set(partition.sessions)

    def serve(self, port: int, address: str = "127.0.0.1") -> int:
        """Expose ``/metrics`` on ``address:port`` (0 picks a port) in a background thread."""
        self._server, _ = start_http_server(port, addr=address, registry=self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop serving; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def render(self) -> str:
        """The text exposition of every metric, as ``/metrics`` serves it."""
        return generate_latest(self.registry).decode()


def status_of(error: BaseException | None) -> str:
    """A launch's ``status`` label: ``ok``, or its error's reason in lower case."""
    if error is None:
        return "ok"
    if isinstance(error, AccyError):
        return error.reason.lower()
    return "internal"


class RingLaunchCounts:
    """Counts the launches that rings take in ``accy_launches`` (a ``RingObserver``): each
    session's pipeline is looked up once, with ``pipeline_of``."""

    def __init__(self, metrics: Metrics, pipeline_of: Callable[[str, str], str]) -> None:
        self._metrics = metrics
        self._pipeline_of = pipeline_of
        self._pipelines: dict[str, str] = {}

    def _pipeline(self, client_id: str, session_id: str) -> str:
        pipeline = self._pipelines.get(session_id)
        if pipeline is None:
            pipeline = self._pipeline_of(client_id, session_id)
            if pipeline != UNKNOWN_PIPELINE:
                if len(self._pipelines) >= SESSIONS_KEPT:
                    self._pipelines.clear()
                self._pipelines[session_id] = pipeline
        return pipeline

    def launched(self, client_id: str, session_id: str, count: int) -> None:
        self._metrics.count_launches(self._pipeline(client_id, session_id), "ok", count)

    def refused(self, client_id: str, session_id: str | None, error: AccyError) -> None:
        pipeline = UNKNOWN_PIPELINE if session_id is None else self._pipeline(client_id, session_id)
        self._metrics.count_launches(pipeline, status_of(error), 1)
