"""A catalog that changes while clients work: SIGHUP and the admin ReloadCatalog call add,
replace and remove pipelines; a client launching throughout loses no call; a session of a
replaced pipeline runs its old kernels until released; a broken catalog changes nothing."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import accy
from accy.errors import FailedPrecondition, NotFound, PermissionDenied
from accy.testing import RunningDaemon, running_daemon
from tests.security.harness import TokenSpec, write_tokens

CATALOG = Path(__file__).parents[1] / "catalogs" / "host_dtypes"
NEW = """
[[pipeline]]
target = "dt.pairsum_again"
version = 1
scalars = [{ name = "n", dtype = "u32", min = 2, max = 1024 }]
operands = [{ name = "x", dtype = "f32", extent = "n" }]
results = [{ name = "y", dtype = "f32", extent = "n / 2" }]
[[pipeline.stage]]
kernel = "dt.pairsum"
version = 1
buffers = ["x", "y"]
scalars = ["n / 2"]
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shutil.copytree(CATALOG, tmp_path / "catalog")
    return tmp_path / "catalog"


@pytest.fixture
def daemon(folder: Path, tmp_path: Path) -> Iterator[tuple[RunningDaemon, dict[str, str]]]:
    tokens = write_tokens(
        tmp_path / "tokens.toml",
        {"admin": TokenSpec("ops", ("admin", "status")), "user": TokenSpec("team")},
    )
    extra = ["--catalog", str(folder), "--tokens", str(tmp_path / "tokens.toml")]
    with running_daemon(backend="host", extra=extra) as running:
        yield running, tokens


def _pipelines(target: str, token: str) -> set[str]:
    with accy.Monitor(target, token=token) as monitor:
        return {p.target for p in monitor.pipelines()}


def _axpy(client: accy.Client, session: accy.Session, x: np.ndarray) -> np.ndarray:
    out = client.empty(x.size, "f16")
    ins = [client.buffer(x), client.buffer(x)]
    session.launch(operands=ins, results=[out], n=x.size, a=1.0)
    got = out.read()
    for buffer in (*ins, out):
        buffer.free()
    return got


def test_a_reload_under_load_loses_no_call(
    daemon: tuple[RunningDaemon, dict[str, str]], folder: Path
) -> None:
    running, tokens = daemon
    target = running.tcp_target
    assert target is not None
    failures: list[BaseException] = []
    launched = 0
    stop = threading.Event()

    def keep_launching() -> None:
        nonlocal launched
        x = np.arange(64, dtype=np.float32)
        with accy.Client(target, token=tokens["user"]) as client:
            while not stop.is_set():
                try:
                    (y,) = client.run("dt.pairsum", x)
                    assert np.array_equal(y, x[::2] + x[1::2])
                    launched += 1
                except BaseException as error:  # every failure is the finding
                    failures.append(error)
                    return

    worker = threading.Thread(target=keep_launching)
    worker.start()
    x = np.arange(8, dtype=np.float16)
    try:
        with accy.Client(target, token=tokens["user"]) as old:
            session = old.load("dt.axpy_f16")
            assert np.array_equal(_axpy(old, session, x), x + x)

            # Replace axpy's kernel (now + 1), add a pipeline, remove one; reload by SIGHUP.
            code = folder / "kernels.py"
            code.write_text(
                code.read_text().replace(
                    "out[:n] = (np.float32(a) * x[:n].astype(np.float32) + y[:n])",
                    "out[:n] = (np.float32(a) * x[:n].astype(np.float32) + y[:n] + 1)",
                )
            )
            manifest = folder / "dtypes.toml"
            text = manifest.read_text()
            start = text.index('[[pipeline]]\ntarget = "dt.copy_bool"')
            end = text.index("[[pipeline]]", start + 1)
            manifest.write_text(text[:start] + text[end:] + NEW)
            os.kill(running.process.pid, signal.SIGHUP)
            deadline = time.monotonic() + 20
            while "dt.pairsum_again" not in _pipelines(target, tokens["user"]):
                assert time.monotonic() < deadline, running.log_text()
                time.sleep(0.1)
            assert "dt.copy_bool" not in _pipelines(target, tokens["user"])

            # The old session runs the kernel it loaded; a new load runs the new one.
            assert np.array_equal(_axpy(old, session, x), x + x)
            with accy.Client(target, token=tokens["user"]) as new:
                with new.load("dt.axpy_f16") as fresh:
                    assert np.array_equal(_axpy(new, fresh, x), x + x + 1)
                with pytest.raises(NotFound):
                    new.load("dt.copy_bool")
            session.release()

            # A broken catalog is refused whole, through the admin call, and nothing changes.
            good = manifest.read_text()
            manifest.write_text(good + '\n[[kernel]]\ntarget = "broken"\n')
            admin = accy.Monitor(target, token=tokens["admin"])
            with admin, pytest.raises(FailedPrecondition, match="field 'version': is required"):
                admin.reload_catalog()
            assert "dt.pairsum_again" in _pipelines(target, tokens["user"])

            # Fixed again, the admin call reloads it; a launch token may not.
            manifest.write_text(good)
            user = accy.Monitor(target, token=tokens["user"])
            with user, pytest.raises(PermissionDenied, match="admin"):
                user.reload_catalog()
            with accy.Monitor(target, token=tokens["admin"]) as monitor:
                change = monitor.reload_catalog()
            assert change["generation"] == 2
            assert (change["added"], change["removed"]) == ([], [])
    finally:
        stop.set()
        worker.join(30)
    assert not failures, failures
    assert launched > 10


def test_kserve_repository_calls_change_the_catalog_for_an_admin(
    daemon: tuple[RunningDaemon, dict[str, str]],
) -> None:
    from accyd.doors.kserve.protocol import open_inference_pb2 as kpb
    from tests.kserve.harness import Door

    running, tokens = daemon
    assert running.tcp_target is not None
    admin, user = (
        Door(running.tcp_target, tokens["admin"]),
        Door(running.tcp_target, tokens["user"]),
    )
    try:

        def ready(name: str) -> bool:
            return bool(user("ModelReady", kpb.ModelReadyRequest(name=name)).ready)

        assert ready("dt.transpose")
        user("RepositoryModelUnload", kpb.RepositoryModelUnloadRequest(model_name="dt.transpose"))
        assert ready("dt.transpose")  # a user's unload drops its own session, nothing more
        admin("RepositoryModelUnload", kpb.RepositoryModelUnloadRequest(model_name="dt.transpose"))
        assert not ready("dt.transpose")
        index = user("RepositoryIndex", kpb.RepositoryIndexRequest())
        assert "dt.transpose" not in {m.name for m in index.models}
        admin("RepositoryModelLoad", kpb.RepositoryModelLoadRequest(model_name="dt.transpose"))
        assert ready("dt.transpose")  # the catalog's folders read again
        refused = admin.refusal(
            "RepositoryModelLoad", kpb.RepositoryModelLoadRequest(model_name="dt.nothing")
        )
        assert refused.code().name == "NOT_FOUND"
    finally:
        admin.close()
        user.close()
