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


def test_the_device_launchers_figures_are_read_at_each_scrape_and_absent_without_it() -> None:
    """What only the launcher knows (records left to the CPU path, failed device launches,
    relaunches, where a launch's time goes) is read from its counters at each scrape; with
    no launcher, or one whose device is lost, the scrape still answers without them."""
    metrics = Metrics()
    stats: dict[str, int] = {}
    broken = False

    def read() -> dict[str, int]:
        if broken:
            raise RuntimeError("device lost")
        return stats

    metrics.watch_launcher(read)
    assert "accy_device_launcher" not in metrics.render()
    stats.update(launched=1200, left=3, errors=1, runs=40, relaunches=36, served_rings=5)
    stats.update(round_ns=3000, look_ns=4500, launch_ns=2000, graph_ns=11000)
    text = metrics.render()
    assert "accy_device_launcher_launches_total 1200.0" in text
    assert "accy_device_launcher_left_total 3.0" in text
    assert "accy_device_launcher_launch_errors_total 1.0" in text
    assert "accy_device_launcher_relaunches_total 36.0" in text
    assert "accy_device_launcher_rings 5.0" in text
    assert 'accy_device_launcher_step_seconds{step="graph"} 1.1e-05' in text
    assert 'accy_device_launcher_step_seconds{step="look"} 4.5e-06' in text
    stats["launched"] = 1500  # read again, not kept from the first scrape
    assert "accy_device_launcher_launches_total 1500.0" in metrics.render()
    broken = True
    text = metrics.render()
    assert "accy_device_launcher" not in text and "accy_clients" in text
