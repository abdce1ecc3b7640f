"""accy installs beside tritonclient[grpc], and its generated code runs at its ranges' floor."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRITONCLIENT = "2.73.0"
# The generated code checks its runtime as it is imported; -W error makes a warning of the
# check (a gencode a major behind, say) fail too.
VERSIONS = (
    "import importlib.metadata as m;"
    "print(*(f'{p}=' + m.version(p) for p in ('grpcio', 'protobuf')))"
)
CLIENT = "import accy, accy.cli, accy.protocol.launch.v1.launch_pb2_grpc;" + VERSIONS
# The daemon's KServe protocol registers the same proto symbols (inference.*) as tritonclient's
# own copy under another file name, so the two cannot share one process: imported on its own.
DAEMON = (
    "import accyd.cli, accyd.doors.kserve.protocol.open_inference_pb2_grpc,"
    " accyd.doors.kserve.protocol.model_config_pb2_grpc;" + VERSIONS
)


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


pytestmark = [
    pytest.mark.slow,
    pytest.mark.network,
    pytest.mark.skipif(not _index_reachable(), reason="PyPI is not reachable from here"),
]


def _floors() -> dict[str, str]:
    """The lower bound of every grpc/protobuf range in pyproject.toml's dependencies."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in project["dependencies"]:
        found = re.fullmatch(r"((?:grpcio|protobuf)[\w-]*)>=([\w.]+),<[\w.]+", requirement)
        if found:
            floors[found[1]] = found[2]
    return floors


def _install(where: Path, *requirements: str) -> Path:
    """A fresh venv at WHERE with accy (from this tree) and REQUIREMENTS installed by pip."""
    venv.create(where, with_pip=True)
    python = where / "bin" / "python"
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, str(ROOT), *requirements],
        check=True,
        env={**os.environ, "ACCYD_NATIVE": "0"},
        timeout=900,
    )
    return python


def _run(python: Path, code: str, cwd: Path) -> str:
    done = subprocess.run(
        [python, "-W", "error", "-c", code],
        cwd=cwd,  # not the source tree: the installed package is imported
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_accy_installs_beside_tritonclient_grpc(tmp_path: Path) -> None:
    python = _install(tmp_path / "venv", f"tritonclient[grpc]=={TRITONCLIENT}")
    out = _run(
        python,
        CLIENT + ";import tritonclient.grpc; print('tritonclient=' + m.version('tritonclient'))",
        tmp_path,
    )
    assert out.split()[:2] == _run(python, DAEMON, tmp_path).split()
    assert f"tritonclient={TRITONCLIENT}" in out, out
    # tritonclient's grpc extra wants protobuf < 7: the environment holds a 6.x
    assert "protobuf=6." in out, out


def test_generated_code_runs_at_the_floor(tmp_path: Path) -> None:
    floors = _floors()
    assert {"grpcio", "protobuf", "grpcio-status"} <= floors.keys(), floors
    python = _install(
        tmp_path / "venv", *(f"{name}=={version}" for name, version in floors.items())
    )
    out = _run(python, CLIENT, tmp_path)
    assert out == _run(python, DAEMON, tmp_path)
    assert f"grpcio={floors['grpcio']}" in out and f"protobuf={floors['protobuf']}" in out, out
