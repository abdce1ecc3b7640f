"""The protocol package: one home for wire constants, used by both the daemon and the client."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2

from accy import _dtypes, cli, errors
from accy._link import names_client
from accy.client import Client, resolve_target
from accy.protocol import (
    CLIENT_UNKNOWN,
    DTYPES,
    ERROR_DOMAIN,
    UnsafeSocketFolder,
    check_socket_folder,
    default_socket_path,
    dtype_named,
    dtype_of_numpy,
    dtype_of_wire,
)
from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.catalog.dtypes import DType
from accyd.doors.grpc import convert
from accyd.doors.grpc.status import to_rpc_status
from accyd.errors import NotFound

SERVER = Path(__file__).resolve().parents[2] / "server" / "accyd"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_daemon_imports_nothing_of_the_client_but_the_protocol() -> None:
    files = sorted(SERVER.rglob("*.py"))
    assert len(files) > 40
    wrong = {
        f"{path.relative_to(SERVER.parent)}: {name}"
        for path in files
        for name in _imported_modules(path)
        if (name == "accy" or name.startswith("accy."))
        and not (name == "accy.protocol" or name.startswith("accy.protocol."))
    }
    assert not wrong, sorted(wrong)


def test_importing_the_protocol_loads_neither_the_client_nor_grpc() -> None:
    probe = (
        "import sys, accy.protocol; "
        "print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith('accy.client')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_an_unknown_client_is_refused_with_reason_client_unknown() -> None:
    status = to_rpc_status(NotFound("no attached client 'cli_x'", field="client_id"), "req_1")
    infos = [error_details_pb2.ErrorInfo() for _ in status.details]
    found = [i for d, i in zip(status.details, infos, strict=True) if d.Unpack(i)]
    assert status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert [(i.reason, i.domain) for i in found] == [(CLIENT_UNKNOWN, ERROR_DOMAIN)]
    assert names_client(errors.from_rpc_status(status))


def test_the_client_reattaches_on_the_reason_not_on_a_field_name() -> None:
    other = errors.NotFound(
        "no buffer 'buf_1'",
        reason="NOT_FOUND",
        field_violations=[errors.FieldViolation("client_id", "a field that happens to match")],
    )
    unknown = errors.NotFound("no attached client", reason=CLIENT_UNKNOWN)
    assert not names_client(other)
    assert names_client(unknown)


def test_both_sides_share_one_dtype_table() -> None:
    assert {d.name for d in DTYPES} == {d.value for d in DType}
    for entry in DTYPES:
        dtype = DType(entry.name)
        assert convert.dtype_to_proto(dtype) == entry.wire
        assert convert.dtype_from_proto(entry.wire, "dtype") is dtype
        assert dtype.numpy == entry.numpy == _dtypes.from_wire(entry.wire)
        assert _dtypes.to_wire(entry.name) == entry.wire
        assert dtype_named(entry.name) is dtype_of_wire(entry.wire) is dtype_of_numpy(entry.numpy)
    assert dtype_of_wire(pb.DTYPE_UNSPECIFIED) is None
    assert dtype_of_numpy(np.dtype(np.complex64)) is None
    assert [d.name for d in DTYPES if not d.scalar] == ["bf16", "f8e4m3", "f8e5m2", "bool"]


def _squat(folder: Path, mode: int = 0o777) -> Path:
    folder.mkdir(parents=True)
    folder.chmod(mode)
    return folder


def test_a_socket_folder_others_can_write_to_is_refused(tmp_path: Path) -> None:
    check_socket_folder(tmp_path / "missing")  # nothing there: nothing listens either
    mine = _squat(tmp_path / "mine", 0o700)
    check_socket_folder(mine)
    for mode in (0o777, 0o770, 0o1777):
        folder = _squat(tmp_path / f"open-{mode:o}", mode)
        with pytest.raises(UnsafeSocketFolder) as caught:
            check_socket_folder(folder)
        assert str(folder) in str(caught.value) and "others may write" in str(caught.value)
        assert "Remove it" in str(caught.value)
    link = tmp_path / "link"
    link.symlink_to(mine)
    with pytest.raises(UnsafeSocketFolder, match="symbolic link"):
        check_socket_folder(link)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_socket_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = _squat(tmp_path / "theirs", 0o700)
    os.chown(folder, 4242, -1)
    with pytest.raises(UnsafeSocketFolder, match="belongs to uid 4242"):
        check_socket_folder(folder)


def test_the_default_socket_and_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ACCY_TARGET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert default_socket_path() == Path(f"/tmp/accy-{os.getuid()}/accyd.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    squatted = _squat(tmp_path / "accy")
    with pytest.raises(UnsafeSocketFolder, match=str(squatted)):
        resolve_target()
    with pytest.raises(UnsafeSocketFolder):
        Client()
    assert cli.main(["status"]) == cli.EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert str(squatted) in err and "--target" in err
    monkeypatch.setenv("ACCY_TARGET", "unix:/elsewhere/accyd.sock")  # chosen, not defaulted
    assert resolve_target() == "unix:/elsewhere/accyd.sock"


def test_the_daemon_refuses_a_squatted_default_folder(tmp_path: Path) -> None:
    squatted = _squat(tmp_path / "accy")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    env.pop("ACCYD_LISTEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "accyd.cli", "serve", "--backend", "host", "--no-supervise"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    assert (
        str(squatted) in done.stderr + done.stdout
        and "others may write" in done.stderr + done.stdout
    )
    assert not (squatted / "accyd.sock").exists()
