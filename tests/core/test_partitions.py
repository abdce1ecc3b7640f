"""Tenants' SM partitions in the core: streams made in them, status and metrics showing them,
and tenants running unconfined, said why, where a device cannot make them."""

from __future__ import annotations

import structlog

from accyd.backends.partitions import PartitionSpec
from accyd.catalog import load_catalog
from accyd.core.daemon import Daemon
from accyd.core.partitions import PartitionStatus
from accyd.core.tenants import Placement
from accyd.telemetry.metrics import Metrics
from accyd.testing import RecordingBackend
from tests.core.daemon_fixtures import ExampleCatalog, host_daemon
from tests.core.semantics_fixtures import TEST_PIPELINE

SPECS = (PartitionSpec("batch", sms=64), PartitionSpec("tenant.b", share=0.25))
PLACES = {"a": Placement("batch", 2), "b": Placement("tenant.b"), "c": Placement(None, 4)}


def gpu_daemon(sms: int = 132) -> tuple[Daemon, RecordingBackend]:
    backend = RecordingBackend(sms=sms)
    return Daemon(ExampleCatalog(), {0: backend}, isolated=True), backend


def load_as(daemon: Daemon, tenant: str) -> str:
    client = daemon.attach(tenant, tenant=tenant).id
    daemon.load_pipeline(client, TEST_PIPELINE.target)
    return client


def test_each_tenants_sessions_run_in_its_partition_at_its_priority() -> None:
    daemon, backend = gpu_daemon()
    with structlog.testing.capture_logs() as logs:
        daemon.split_sms(SPECS, PLACES)
    assert [e["event"] for e in logs] == [
        "SM partitions of device 0 (132 SMs): batch 64, tenant.b 32"
    ]
    for tenant in ("a", "a", "b", "c", "d"):
        load_as(daemon, tenant)
    assert backend.stream_places == [
        ("batch", 2),
        ("batch", 2),
        ("tenant.b", 0),
        (None, 4),  # a priority alone: the whole device
        (None, 0),  # no place of its own: as before
    ]
    status = daemon.status()
    (device,) = status.devices
    assert device.unconfined == ""
    assert device.partitions == (
        PartitionStatus("batch", 64, 2, ("a",)),
        PartitionStatus("tenant.b", 32, 1, ("b",)),
    )
    places = {t.name: (t.partition, t.priority) for t in status.tenants}
    assert places == {"a": ("batch", 2), "b": ("tenant.b", 0), "c": ("", 4), "d": ("", 0)}
    metrics = Metrics()
    metrics.show(status)
    text = metrics.render()
    assert 'accy_partition_sms{device="0",partition="batch"} 64.0' in text
    assert 'accy_partition_sessions{device="0",partition="batch"} 2.0' in text
    assert 'accy_device_partitions_unconfined{device="0"} 0.0' in text
    daemon.close()


def test_partitions_that_do_not_fit_leave_their_tenants_unconfined_and_say_why() -> None:
    daemon, backend = gpu_daemon(sms=64)  # 64 + 16 SMs asked for
    with structlog.testing.capture_logs() as logs:
        daemon.split_sms(SPECS, PLACES)
    (line,) = logs
    assert line["log_level"] == "warning"
    assert line["event"].startswith("SM partitions not made on device 0: the partitions ask ")
    load_as(daemon, "a")
    assert backend.stream_places == [(None, 2)]  # unconfined, its priority kept
    status = daemon.status()
    assert status.devices[0].partitions == () and "more than" in status.devices[0].unconfined
    (a,) = status.tenants
    assert a.partition.startswith("unconfined: the partitions ask for 80 SMs")
    metrics = Metrics()
    metrics.show(status)
    assert 'accy_device_partitions_unconfined{device="0"} 1.0' in metrics.render()
    daemon.close()


def test_the_host_backend_says_at_start_that_it_cannot_confine() -> None:
    daemon, _ = host_daemon(catalog=load_catalog())
    with structlog.testing.capture_logs() as logs:
        daemon.split_sms(SPECS, PLACES)
    assert [e["event"] for e in logs] == [
        "SM partitions not made on device 0: the host backend runs kernels on CPU threads, "
        "not SMs; their tenants run unconfined"
    ]
    client = daemon.attach("a", tenant="a").id
    daemon.load_pipeline(client, "accy.kernel.saxpy")  # still serves, on the whole device
    (a,) = daemon.status().tenants
    assert a.partition == "unconfined: the host backend runs kernels on CPU threads, not SMs"
    daemon.close()


def test_a_reload_moves_tenants_for_new_sessions_and_only_logs_new_partitions() -> None:
    daemon, backend = gpu_daemon()
    daemon.split_sms(SPECS, PLACES)
    with structlog.testing.capture_logs() as logs:
        daemon.place_tenants((*SPECS, PartitionSpec("more", sms=8)), {"d": Placement("batch")})
    assert "restart the daemon" in logs[0]["event"]
    load_as(daemon, "d")
    load_as(daemon, "a")  # its place is gone with the reload
    assert backend.stream_places == [("batch", 0), (None, 0)]
    daemon.close()


def test_a_replacement_backend_is_split_before_it_serves() -> None:
    daemon, _ = gpu_daemon()
    daemon.split_sms(SPECS, PLACES)
    spare = RecordingBackend(sms=132)
    daemon.replace_device(0, spare)
    assert [p.name for p in spare.split.partitions] == ["batch", "tenant.b"]
    load_as(daemon, "a")
    assert spare.stream_places == [("batch", 2)]
    daemon.close()


def test_a_session_may_lower_its_priority_below_its_tenants_never_raise_it() -> None:
    """KServe's ``priority`` parameter: a request asks for less than its tenant's priority
    (a session of its own), and no more than the tokens file gave the tenant."""
    daemon, backend = gpu_daemon()
    daemon.split_sms(SPECS, PLACES)
    client = daemon.attach("a", tenant="a").id
    at = [daemon.load_pipeline(client, TEST_PIPELINE.target, lowered=n) for n in (0, 1, 9, 1)]
    assert backend.stream_places == [("batch", 2), ("batch", 1), ("batch", 0)]
    assert at[1].session_id == at[3].session_id != at[0].session_id  # one session a level
