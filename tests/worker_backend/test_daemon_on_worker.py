"""The core's own host-backend tests, run again on a daemon whose backend is a device worker.

Each test below is one of ``tests/core``'s, called with its module's ``host_daemon``
swapped for one that builds the ``Daemon`` over a ``WorkerBackend``: launches,
scratch, waits (threads and awaited), settle and notify, prepared launches,
detach with dropped work, quotas, all through the worker's channel.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.catalog import Catalog, load_catalog
from accyd.core.daemon import Daemon
from accyd.core.tenants import Quotas

CORE_TESTS = [
    ("tests.core.test_daemon", "test_host_scan_results_and_in_order_chain"),
    ("tests.core.test_daemon", "test_a_watched_launch_settles_or_notifies_once_its_work_finished"),
    ("tests.core.test_daemon", "test_run_without_attaching_is_held_to_the_callers_tenant_quotas"),
    ("tests.core.test_core_facade", "test_one_client_may_have_only_so_many_launches_in_flight"),
    (
        "tests.core.test_core_facade",
        "test_a_detached_clients_queued_launches_are_dropped_and_counted_until_freed",
    ),
    ("tests.core.test_core_facade", "test_awaited_waits_hold_no_thread_and_report_the_launch"),
    (
        "tests.core.test_prepared_frees",
        "test_freeing_a_buffer_drops_the_prepared_launches_that_name_it",
    ),
]


@pytest.fixture
def worker_daemons() -> Iterator[Callable[..., tuple[Daemon, WorkerBackend]]]:
    made: list[WorkerBackend] = []

    def worker_daemon(
        quotas: Quotas | None = None, catalog: Catalog | None = None, **options: Any
    ) -> tuple[Daemon, WorkerBackend]:
        backend = WorkerBackend("host", 0, log_level="warning")
        made.append(backend)
        daemon = Daemon(catalog or load_catalog(), {0: backend}, quotas=quotas, **options)
        return daemon, backend

    yield worker_daemon
    for backend in made:
        backend.close()
        assert backend.reaped


@pytest.mark.parametrize(("module", "name"), CORE_TESTS, ids=[name for _, name in CORE_TESTS])
def test_core_flow_on_a_worker(
    module: str,
    name: str,
    worker_daemons: Callable[..., tuple[Daemon, WorkerBackend]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tests = importlib.import_module(module)
    monkeypatch.setattr(tests, "host_daemon", worker_daemons)
    getattr(tests, name)()
