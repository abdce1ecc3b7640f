"""Metrics live in a registry per daemon and are served over HTTP on a port of their own."""

from __future__ import annotations

import urllib.request

from accyd.telemetry.metrics import Metrics


def test_two_daemons_do_not_share_metrics() -> None:
    first, second = Metrics(), Metrics()
    first.launches.labels("accy.kernel.saxpy", "ok").inc()
    assert 'accy_launches_total{pipeline="accy.kernel.saxpy",status="ok"} 1.0' in first.render()
    assert "accy.kernel.saxpy" not in second.render()


def test_metrics_are_served_over_http() -> None:
    metrics = Metrics()
    metrics.memory.labels("team-a").set(4096)
    metrics.launch_seconds.labels("accy.kernel.device_scan", "true").observe(0.0003)
    port = metrics.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        metrics.close()
        metrics.close()
    assert 'accy_device_memory_bytes{tenant="team-a"} 4096.0' in text
    assert (
        'accy_launch_seconds_bucket{le="0.0005",pipeline="accy.kernel.device_scan",'
        'waited="true"} 1.0' in text
    )
