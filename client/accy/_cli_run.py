"""``accy run``: run a pipeline on random inputs, time each phase, check against numpy."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from accy import _table, references
from accy._chunks import Progress
from accy._cli_files import FileError, read_inputs, write_outputs
from accy._extent import ExtentError
from accy._models import BufferSpec, PipelineInfo
from accy.client import Buffer, Client
from accy.protocol import dtype_of_numpy

__all__ = ["EXIT_CHECK_FAILED", "UsageError", "parse_scalar", "run"]

EXIT_CHECK_FAILED = 1
"""``--check`` found a result outside tolerance, or could not check at all."""


class UsageError(Exception):
    """Arguments that do not fit the pipeline: exit code 2 with one line."""


# -- progress --------------------------------------------------------------------------


def _progress(label: str, total: int, stream: TextIO) -> Progress | None:
    """A chunk-progress printer for large transfers on a terminal; ``None`` otherwise."""
    if total < (32 << 20) or not stream.isatty():
        return None
    last = [0.0]

    def report(done: int, of: int) -> None:
        now = time.monotonic()
        if done < of and now - last[0] < 0.1:
            return
        last[0] = now
        end = "\n" if done >= of else ""
        stream.write(f"\r{label}: {done / of:4.0%} of {_table.bytes_text(of)}{end}")
        stream.flush()

    return report


# -- run -------------------------------------------------------------------------------


def parse_scalar(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


def _typed_scalars(
    info: PipelineInfo, given: Sequence[tuple[str, str]], rng: np.random.Generator
) -> tuple[dict[str, float], list[str]]:
    """Typed runtime scalars: given ones parsed by dtype, missing floats drawn at random."""
    values: dict[str, float] = {}
    for name, text in given:
        try:
            spec = info.scalar(name)
        except KeyError as error:
            raise UsageError(str(error.args[0])) from None
        try:
            values[name] = int(text, 0) if spec.is_integer else float(text)
        except ValueError:
            raise UsageError(f"scalar {name}={text!r} is not a {spec.dtype}") from None
    drawn = []
    missing = []
    for spec in info.runtime_scalars:
        if spec.name in values:
            continue
        if spec.is_integer:
            missing.append(spec.name)
        else:
            values[spec.name] = float(spec.dtype.type(rng.random()))
            drawn.append(spec.name)
    if missing:
        flags = " ".join(f"--scalar {m}=VALUE" for m in missing)
        raise UsageError(f"{info.target} needs integer scalars: {flags}")
    _check_bounds(info, values)
    return values, drawn


def _check_bounds(info: PipelineInfo, values: Mapping[str, float]) -> None:
    """Refuse a scalar outside the pipeline's bounds in the daemon's words, before any input
    is made for it (a huge ``--n`` would otherwise be built here first)."""
    for spec in info.runtime_scalars:
        value = values.get(spec.name)
        if value is None or spec.max is None:
            continue
        if value > spec.max or (spec.min is not None and value < spec.min):
            raise UsageError(
                f"runtime scalar {spec.name!r} is {value}; {info.target} accepts "
                f"{spec.bounds_text()}"
            )


def _random_input(
    rng: np.random.Generator, count: int, dtype: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    """Random values the type holds: floats (half, bfloat16 and fp8 too) in [0, 1), booleans,
    integers in [0, 100)."""
    entry = dtype_of_numpy(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=count).astype(dtype)
    if entry is not None and entry.is_float:
        return rng.random(count, dtype=np.float64).astype(dtype)
    return rng.integers(0, 100, size=count, dtype=dtype)


def _shape(spec: BufferSpec, integers: Mapping[str, int]) -> tuple[int, np.dtype[Any]]:
    """Elements and dtype of one operand or result for these scalars."""
    try:
        count = spec.elements(integers)
    except ExtentError as error:
        raise UsageError(str(error)) from None
    return count, spec.dtype or np.dtype(np.float32)


@dataclass
class _RunReport:
    target: str
    version: int
    format: str
    backend: str
    device_name: str
    scalars: dict[str, float]
    drawn_scalars: list[str]
    seed: int
    repeat: int
    bytes_up: int = 0
    bytes_down: int = 0
    load_seconds: float = 0.0
    upload_seconds: float = 0.0
    launch_seconds: list[float] = field(default_factory=list)
    daemon_seconds: list[float] = field(default_factory=list)
    """The daemon's own time per launch, where it answered each (not through a ring)."""
    download_seconds: float = 0.0
    check: list[dict[str, Any]] | None = None
    check_note: str | None = None
    """Why ``--check`` could not check: the run is then not ok."""
    outputs: list[str] = field(default_factory=list)
    """The ``.npy`` files ``--output`` wrote."""

    @property
    def ok(self) -> bool:
        if self.check_note:
            return False
        return self.check is None or all(c["ok"] for c in self.check)

    def to_dict(self) -> dict[str, Any]:
        launches = self.launch_seconds
        return {
            "target": self.target,
            "version": self.version,
            "format": self.format,
            "backend": self.backend,
            "device_name": self.device_name,
            "scalars": self.scalars,
            "seed": self.seed,
            "repeat": self.repeat,
            "bytes_uploaded": self.bytes_up,
            "bytes_downloaded": self.bytes_down,
            "load_seconds": self.load_seconds,
            "upload_seconds": self.upload_seconds,
            "launch_p50_seconds": statistics.median(launches),
            "launch_min_seconds": min(launches),
            "launch_seconds": launches,
            "daemon_launch_p50_seconds": (
                statistics.median(self.daemon_seconds) if self.daemon_seconds else None
            ),
            "download_seconds": self.download_seconds,
            "check": self.check,
            "check_note": self.check_note,
            "outputs": self.outputs,
            "ok": self.ok,
        }

    def to_text(self) -> str:
        scalars = ", ".join(
            f"{k}={v if isinstance(v, int) else f'{v:g}'}"
            f"{' (random)' if k in self.drawn_scalars else ''}"
            for k, v in self.scalars.items()
        )
        t = _table.seconds_text
        launches = self.launch_seconds
        daemon = self.daemon_seconds
        on_daemon = f"; daemon p50 {t(statistics.median(daemon))}" if daemon else ""
        rows = [
            ["load", t(self.load_seconds), ""],
            [
                "upload",
                t(self.upload_seconds),
                f"{_table.bytes_text(self.bytes_up)}, "
                f"{_table.rate_text(self.bytes_up, self.upload_seconds)}",
            ],
            [
                "launch p50",
                t(statistics.median(launches)),
                f"min {t(min(launches))} over {len(launches)}{on_daemon}",
            ],
            [
                "download",
                t(self.download_seconds),
                f"{_table.bytes_text(self.bytes_down)}, "
                f"{_table.rate_text(self.bytes_down, self.download_seconds)}",
            ],
        ]
        for c in self.check or []:
            verdict = "ok" if c["ok"] else "MISMATCH"
            rows.append(
                [
                    f"check {c['result']}",
                    verdict,
                    f"relative L2 error {c['error']:.3g} (tolerance {c['tolerance']:.3g})",
                ]
            )
        if self.check_note:
            rows.append(["check", "NOT CHECKED", self.check_note])
        rows += [["saved", "", path] for path in self.outputs]
        head = (
            f"{self.target} v{self.version} ({self.format}) on {self.backend}"
            f" [{self.device_name}]: {scalars}; seed {self.seed}"
        )
        return head + "\n" + _table.plain(["phase", "time", "detail"], rows)


def run(client: Client, args: argparse.Namespace) -> int:
    """``accy run``: returns the exit code."""
    info = client.pipeline(args.pipeline, args.version)
    rng = np.random.default_rng(args.seed)
    given = list(args.scalar)
    if args.n is not None:
        given.insert(0, ("n", str(args.n)))
    try:
        files = read_inputs(info, args.input)
    except FileError as error:
        raise UsageError(str(error)) from None
    named: dict[str, float] = {name: 0 for name, _ in given}
    for spec in info.operands:  # scalars a file's length or dims give, unless given
        if spec.name in files:
            spec.default_scalars(files[spec.name], named)
    given += [(k, str(v)) for k, v in named.items() if k not in dict(given)]
    scalars, drawn = _typed_scalars(info, given, rng)
    integers = {k: int(v) for k, v in scalars.items() if info.scalar(k).is_integer}
    inputs = [
        files[spec.name].reshape(-1)
        if spec.name in files
        else _random_input(rng, *_shape(spec, integers))
        for spec in info.operands
    ]
    err = sys.stderr
    started = time.perf_counter()
    session = client.load(args.pipeline, args.version, args.format)
    report = _RunReport(
        target=info.target,
        version=session.info.version,
        format=session.format,
        backend=client.attachment.backend,
        device_name=client.attachment.device_name,
        scalars=scalars,
        drawn_scalars=drawn,
        seed=args.seed,
        repeat=args.repeat,
    )
    buffers: list[Buffer] = []
    try:
        session.allocate_intermediates(**scalars)
        report.load_seconds = time.perf_counter() - started

        started = time.perf_counter()
        for spec, array in zip(info.operands, inputs, strict=True):
            progress = _progress(f"upload {spec.name}", array.nbytes, err)
            buffers.append(client.buffer(array, progress=progress))
        report.upload_seconds = time.perf_counter() - started
        report.bytes_up = sum(a.nbytes for a in inputs)

        outputs = [client.empty(*_shape(spec, integers)) for spec in info.results]
        buffers.extend(outputs)
        show = err.isatty() and args.repeat >= 20
        for k in range(args.repeat):
            started = time.perf_counter()
            launch = session.launch(buffers[: len(inputs)], outputs, wait=True, **scalars)
            report.launch_seconds.append(time.perf_counter() - started)
            if launch.elapsed_seconds is not None:  # a ring launch has no answer to time
                report.daemon_seconds.append(launch.elapsed_seconds)
            if show and (k + 1) % max(1, args.repeat // 20) == 0:
                err.write(f"\rlaunch {k + 1}/{args.repeat}")
                err.flush()
        if show:
            err.write("\n")

        started = time.perf_counter()
        results = []
        for spec, out in zip(info.results, outputs, strict=True):
            results.append(out.read(progress=_progress(f"download {spec.name}", out.nbytes, err)))
        report.download_seconds = time.perf_counter() - started
        report.bytes_down = sum(r.nbytes for r in results)
    finally:
        for buffer in buffers:
            buffer.free()
        session.release()

    if args.check:
        reference = references.find(info.target)
        if reference is None:
            report.check_note = (
                f"no reference is known for {info.target}, so its results were not checked; "
                "run without --check to only time it"
            )
        else:
            report.check = [
                {
                    "result": info.results[c.index].name,
                    "error": c.error,
                    "tolerance": c.tolerance,
                    "ok": c.ok,
                }
                for c in references.compare(reference, inputs, results, scalars)
            ]
    if args.output is not None:
        report.outputs = [str(p) for p in write_outputs(info, results, scalars, args.output)]
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.to_text())
    if report.check_note:
        print(f"accy: {report.check_note}", file=err)
    return 0 if report.ok else EXIT_CHECK_FAILED
