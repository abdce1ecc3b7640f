"""Element types, shapes and expressions end to end on the host backend: every new dtype
through the one-call path and through launches on each way in, shaped results, the CLI,
and the refusals a user meets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import accy
from accy.errors import InvalidArgument
from accy.protocol.ring import RING_ENV
from accy.testing import RunningDaemon, running_daemon

CATALOG = Path(__file__).parents[1] / "catalogs" / "host_dtypes"
RNG = np.random.default_rng(11)
DTYPES = {
    "i8": np.int8,
    "i16": np.int16,
    "u16": np.uint16,
    "bool": np.bool_,
    "f8e4m3": ml_dtypes.float8_e4m3fn,
    "f8e5m2": ml_dtypes.float8_e5m2,
}


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="host", extra=["--catalog", str(CATALOG)]) as running:
        yield running


@pytest.fixture(params=["ring", "unix", "tcp"])
def client(
    request: pytest.FixtureRequest, daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> Iterator[accy.Client]:
    if request.param == "unix":
        monkeypatch.setenv(RING_ENV, "0")
    target = daemon.tcp_target if request.param == "tcp" else daemon.unix_target
    assert target is not None
    with accy.Client(target) as connected:
        yield connected


def _launched(client: accy.Client, target: str, *arrays: np.ndarray, **scalars: Any) -> list:
    """The pipeline's results through buffers and one waited launch."""
    info = client.pipeline(target)
    values: dict[str, float] = dict(scalars)
    for spec, array in zip(info.operands, arrays, strict=True):
        spec.default_scalars(array, values)
    ints = {k: int(v) for k, v in values.items() if float(v).is_integer()}
    with client.load(target) as session:
        ins = [client.buffer(a) for a in arrays]
        outs = [client.empty(spec.dims(ints), spec.dtype) for spec in info.results]
        session.launch(operands=ins, results=outs, **values)
        return [out.read() for out in outs]


def test_half_precision_both_ways(client: accy.Client) -> None:
    x, y = (RNG.standard_normal(1000).astype(np.float16) for _ in range(2))
    want = (np.float32(0.5) * x.astype(np.float32) + y).astype(np.float16)
    (ran,) = client.run("dt.axpy_f16", x, y, a=0.5)
    (launched,) = _launched(client, "dt.axpy_f16", x, y, a=0.5)
    assert ran.dtype == launched.dtype == np.float16
    np.testing.assert_array_equal(ran, want)
    np.testing.assert_array_equal(launched, want)


def test_bfloat16(client: accy.Client) -> None:
    x = RNG.standard_normal(777).astype(ml_dtypes.bfloat16)
    want = (x.astype(np.float32) * np.float32(2) + x).astype(ml_dtypes.bfloat16)
    (ran,) = client.run("dt.scale_bf16", x, s=2.0)
    assert ran.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(ran.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_every_new_type_travels_unchanged(client: accy.Client, name: str) -> None:
    raw = RNG.integers(0, 256, 301, dtype=np.uint8)
    x = (
        raw.view(DTYPES[name])
        if np.dtype(DTYPES[name]).itemsize == 1
        else raw[:300].view(DTYPES[name])
    )
    if name == "bool":
        x = raw.astype(bool)
    (ran,) = client.run(f"dt.copy_{name}", x)
    (launched,) = _launched(client, f"dt.copy_{name}", x)
    for got in (ran, launched):
        assert got.dtype == np.dtype(DTYPES[name])
        np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8))


def test_shaped_results_come_back_in_their_shape(client: accy.Client) -> None:
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    (ran,) = client.run("dt.transpose", x)  # rows and cols read from the array's shape
    assert ran.shape == (3, 5)
    np.testing.assert_array_equal(ran, x.T)
    (launched,) = _launched(client, "dt.transpose", x)
    assert launched.shape == (3, 5)
    np.testing.assert_array_equal(launched, x.T)


def test_new_expressions(client: accy.Client) -> None:
    x = RNG.standard_normal(1001).astype(np.float32)
    (ran,) = client.run("dt.pairsum", x)
    assert ran.shape == (500,)
    np.testing.assert_array_equal(ran, x[:1000:2] + x[1:1000:2])


def test_dtype_names_are_accys_not_numpys(daemon: RunningDaemon) -> None:
    with accy.Client(daemon.unix_target) as client:
        assert client.empty(4, "i8").dtype == np.dtype(np.int8)  # numpy's "i8" is int64
        with pytest.raises(TypeError, match="unknown dtype 'f8'"):
            client.empty(4, "f8")  # numpy's "f8" is float64


def test_a_wrong_shape_or_type_is_refused(daemon: RunningDaemon) -> None:
    with accy.Client(daemon.unix_target) as client:
        with pytest.raises(InvalidArgument, match="is float32, the pipeline takes f16"):
            client.run("dt.axpy_f16", np.ones(4, np.float32), np.ones(4, np.float32), a=1.0)
        with pytest.raises(InvalidArgument, match="needs runtime scalar 'rows'"):
            client.run("dt.transpose", np.ones((2, 2, 2), np.float32))  # no dims to read
        with pytest.raises(InvalidArgument, match="holds 16 bytes; these runtime scalars need 24"):
            client.run("dt.transpose", np.ones((2, 2), np.float32), rows=2, cols=3)


def test_the_cli_lists_types_and_shapes_and_runs_them(daemon: RunningDaemon) -> None:
    base = [sys.executable, "-m", "accy.cli", "--target", daemon.unix_target]
    listed = subprocess.run([*base, "pipelines", "--json"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    pipelines = {p["target"]: p for p in json.loads(listed.stdout)}
    transpose = pipelines["dt.transpose"]
    assert transpose["results"][0]["shape"] == ["cols", "rows"]
    assert pipelines["dt.scale_bf16"]["operands"][0]["dtype"] == "bf16"
    for args in (
        ["dt.axpy_f16", "--n", "1000", "--scalar", "a=2.0"],
        ["dt.scale_bf16", "--n", "100", "--scalar", "s=0.5"],
        ["dt.transpose", "--scalar", "rows=5", "--scalar", "cols=3"],
        ["dt.copy_f8e5m2", "--n", "64"],
    ):
        ran = subprocess.run([*base, "run", *args], capture_output=True, text=True)
        assert ran.returncode == 0, ran.stdout + ran.stderr


def test_accy_run_reads_npy_inputs_and_saves_shaped_outputs(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    base = [sys.executable, "-m", "accy.cli", "--target", daemon.unix_target, "run"]
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ran = subprocess.run(
        [
            *base,
            "dt.transpose",
            "--input",
            f"x={tmp_path / 'x.npy'}",
            "--output",
            str(tmp_path / "out"),
            "--json",
        ],
        capture_output=True,
        text=True,
    )  # rows and cols come from the file's dims
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(ran.stdout)["outputs"] == [str(tmp_path / "out" / "y.npy")]
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), x.T)

    np.save(tmp_path / "wide.npy", x.astype(np.float64))
    wrong = subprocess.run(
        [*base, "dt.transpose", "--input", f"x={tmp_path / 'wide.npy'}"],
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 2
    assert "holds float64; dt.transpose takes f32 (save it as that type)" in wrong.stderr
    unknown = subprocess.run(
        [*base, "dt.transpose", "--input", f"z={tmp_path / 'x.npy'}"],
        capture_output=True,
        text=True,
    )
    assert unknown.returncode == 2 and "has no operand 'z' (x)" in unknown.stderr
