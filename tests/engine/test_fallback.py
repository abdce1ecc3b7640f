"""Where the native engine cannot be built or loaded, accy still builds and the Python loop
serves, saying so once."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import structlog.testing

import accyd.ring.engine
from accyd.ring.engine.auto import open_engine
from accyd.ring.engine.pyloop import PythonLoop
from tests.core.daemon_fixtures import host_daemon

ROOT = Path(__file__).resolve().parents[2]


def test_without_the_extension_the_python_loop_serves_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "accyd.ring.engine._native", None)  # as if never built
    monkeypatch.delitem(sys.modules, "accyd.ring.engine.native", raising=False)
    monkeypatch.delattr(accyd.ring.engine, "_native", raising=False)
    daemon, _ = host_daemon()
    try:
        with structlog.testing.capture_logs() as logs:
            engine = open_engine(daemon, kind="auto")
        assert isinstance(engine, PythonLoop)
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert len(warnings) == 1 and "Python ring loop serves" in warnings[0]["event"]
        engine.close()
        with pytest.raises(ImportError):  # asked for by name, it is an error
            open_engine(daemon, kind="native")
    finally:
        daemon.close()


@pytest.mark.slow
def test_a_machine_without_a_compiler_still_builds_accy(tmp_path: Path) -> None:
    """The extension is optional: with no working C compiler the wheel builds without it
    (from the tracked files alone, as a fresh checkout has them)."""
    source = tmp_path / "source"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no list of the tracked files")
    for name in filter(None, listed.stdout.split(b"\0")):
        if not (ROOT / os.fsdecode(name)).is_file():
            continue  # deleted in this working tree, or not carried here
        target = source / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ROOT / os.fsdecode(name)).read_bytes())
    env = dict(os.environ, CC="false", LDSHARED="false")
    wheel_args = ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "pip", *wheel_args, str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = tmp_path.glob("accy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "accyd/ring/engine/native.py" in names
    assert not [n for n in names if n.endswith(".so")]
