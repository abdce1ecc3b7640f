"""Phase C of the two-device benchmark: a fault on device 1 while device 0's clients loop.

Loop workers (``_two_devices_clients``) on device 0 check every result. This process holds
three clients, all attached before the fault: the faulting one (``accy.test.fault`` loaded on
device 1), a probe, and one with a device_scan session and buffers on both devices. Once the
loops run steadily the faulting launch is sent; from its answer the probe keeps trying load +
allocate + launch on device 1 until a result checks; then the two-device client uses its
device-0 objects (they must still work), its old device-1 buffer and session (they must read
as lost) and new ones on device 1. The loops go on a little longer, then stop; their checked
results are split at the fault and at device 1's return.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from _two_devices_clients import (
    SCAN,
    CheckFailed,
    Pool,
    ScanClient,
    describe,
    is_lost,
    relative_error,
)

from accy import Client, errors

__all__ = ["FAULT", "FaultOutcome", "fault_phase", "listed_devices", "split_times"]

FAULT = "accy.test.fault"
PROBE_PAUSE = 0.002
"""Seconds the probe waits after a failed try before the next."""
TIMEOUT = 30.0
"""Seconds any one call of this phase's clients may take."""


@dataclass
class FaultOutcome:
    """What phase C saw. Times in seconds; ``*_at`` are ``time.monotonic`` values."""

    loopers: int
    n: int
    probe_n: int
    fault_sent_at: float = 0.0
    fault_answer_s: float | None = None
    """From sending the faulting launch to its answer."""
    fault_code: str = ""
    fault_reason: str | None = None
    fault_session: str = ""
    fault_session_named: bool = False
    fault_metadata: dict[str, str] = field(default_factory=dict)
    probe_good_s: float | None = None
    """From the faulting launch's answer to the probe's first checked result on device 1."""
    probe_tries: int = 0
    probe_errors: list[str] = field(default_factory=list)
    device0_checked: dict[str, int] = field(default_factory=dict)
    """Device 0's checked results before the fault, until device 1 served again, and after."""
    device0_rates: dict[str, float] = field(default_factory=dict)
    device0_errors: int = 0
    device0_error_kinds: dict[str, int] = field(default_factory=dict)
    device0_first_errors: list[str] = field(default_factory=list)
    """The first error of each kind in each loop, its time from the fault sent."""
    device0_reattachments: int = 0
    both_device0: str = ""
    """The two-device client's device-0 session and buffers after the fault: ``ok`` or why not."""
    both_device1_buffer: str = ""
    both_device1_buffer_lost: bool = False
    both_device1_session: str = ""
    both_device1_session_lost: bool = False
    both_device1_new: str = ""
    reattachments: dict[str, int] = field(default_factory=dict)
    """Of this process's clients: fault, probe, both."""
    instance_changed: bool | None = None
    serving_after: bool | None = None
    devices_listed: list[int] | None = None
    status_after: dict[str, Any] = field(default_factory=dict)
    loops: list[dict[str, Any]] = field(default_factory=list)


def split_times(times: Sequence[float], cuts: Sequence[float]) -> list[int]:
    """How many of ``times`` fall before ``cuts[0]``, between each pair of cuts, after the last."""
    counts = [0] * (len(cuts) + 1)
    for t in times:
        counts[sum(t >= cut for cut in cuts)] += 1
    return counts


def listed_devices(fields: Mapping[str, Any]) -> list[int] | None:
    """The device ordinals a status (``Status.to_dict()``, ``accy status --json``) lists in its
    ``devices`` entries; ``None`` where it lists none (a daemon without per-device status)."""
    entries = fields.get("devices")
    if not entries:
        return None
    found: list[int] = []
    for entry in entries:
        if isinstance(entry, int):
            found.append(entry)
        elif isinstance(entry, Mapping):
            ordinal = next(
                (entry[k] for k in ("device", "ordinal", "index") if isinstance(entry.get(k), int)),
                None,
            )
            if ordinal is not None:
                found.append(ordinal)
    return sorted(found)


def _attempt(what: Callable[[], object]) -> tuple[str, bool]:
    """``ok``, or the error's description and whether it says the object was lost."""
    try:
        what()
    except (errors.AccyError, CheckFailed) as error:
        return describe(error), is_lost(error)
    return "ok", False


def _probe_once(client: Client, n: int, seed: int) -> None:
    """Load device_scan on device 1, allocate there, launch on random data, check every element."""
    data = np.random.default_rng(seed).random(n, dtype=np.float32)
    session = client.load(SCAN, device=1)
    x, y = client.buffer(data, device=1), client.empty(n, "f32", device=1)
    session.launch([x], [y], n=n)
    relative_error(y.read(), data)
    for thing in (x, y, session):
        with contextlib.suppress(errors.AccyError):
            thing.close()


def _fault(outcome: FaultOutcome, client: Client) -> float:
    """Launch the faulting pipeline on device 1; note what came back. Returns the answer's time."""
    session = client.load(FAULT, device=1)
    x, y = client.buffer(np.ones(16, np.float32), device=1), client.empty(16, "f32", device=1)
    outcome.fault_session = session.id
    outcome.fault_sent_at = time.monotonic()
    try:
        session.launch([x], [y], n=16)
        outcome.fault_code = "OK (the faulting launch succeeded)"
    except errors.AccyError as error:
        outcome.fault_code, outcome.fault_reason = error.code.name, error.reason
        outcome.fault_metadata = dict(error.metadata)
        outcome.fault_session_named = session.id in error.metadata.values()
    answered = time.monotonic()
    outcome.fault_answer_s = answered - outcome.fault_sent_at
    return answered


def _probe(outcome: FaultOutcome, client: Client, answered: float, timeout: float) -> float | None:
    """Try device 1 until a checked result or ``timeout``; returns when it succeeded."""
    deadline = answered + timeout
    while time.monotonic() < deadline:
        outcome.probe_tries += 1
        try:
            _probe_once(client, outcome.probe_n, outcome.probe_tries)
        except (errors.AccyError, CheckFailed) as error:
            outcome.probe_errors.append(f"+{time.monotonic() - answered:.3f} s {describe(error)}")
            time.sleep(PROBE_PAUSE)
            continue
        good = time.monotonic()
        outcome.probe_good_s = good - answered
        return good
    return None


def _use_both(outcome: FaultOutcome, client: Client, scans: Mapping[int, ScanClient]) -> None:
    """The two-device client after the fault: device 0 as before, device 1's old objects lost."""
    n = outcome.probe_n
    outcome.both_device0, _ = _attempt(lambda: [scans[0].step(check=True) for _ in range(2)])
    old = scans[1]
    outcome.both_device1_buffer, outcome.both_device1_buffer_lost = _attempt(
        lambda: old.output.read(count=1)
    )

    def old_session() -> None:
        x, y = client.buffer(np.ones(n, np.float32), device=1), client.empty(n, "f32", device=1)
        old.session.launch([x], [y], n=n)

    outcome.both_device1_session, outcome.both_device1_session_lost = _attempt(old_session)
    outcome.both_device1_new, _ = _attempt(lambda: ScanClient(client, 1, n).check_fully(9))


def _loop_specs(target: str, loopers: int, n: int) -> list[dict[str, Any]]:
    return [
        {
            "target": target,
            "name": f"two-devices-c-{i}",
            "device": 0,
            "n": n,
            "seconds": 600.0,  # until told to stop
            "check_every": 1,
            "times": True,
            "seed": i,
            "timeout": TIMEOUT,
        }
        for i in range(loopers)
    ]


def _count_loops(outcome: FaultOutcome, loops: list[dict[str, Any]], cuts: list[float]) -> None:
    """Split device 0's checked results at the fault and at device 1's return; rates of each."""
    names = ("before", "until_device1_back", "after")
    counts = [0, 0, 0]
    outcome.loops = []
    for loop in loops:
        split = split_times(loop["good_times"], cuts[1:3])
        counts = [total + count for total, count in zip(counts, split, strict=True)]
        summary = {k: v for k, v in loop.items() if k != "good_times"}
        outcome.loops.append(summary | {"checked_by_span": dict(zip(names, split, strict=True))})
    outcome.device0_checked = dict(zip(names, counts, strict=True))
    spans = [cuts[i + 1] - cuts[i] for i in range(3)]
    outcome.device0_rates = {
        name: count / span for name, count, span in zip(names, counts, spans, strict=True) if span
    }
    outcome.device0_errors = sum(r["errors"] for r in loops)
    for loop in loops:
        for kind, count in loop["error_kinds"].items():
            outcome.device0_error_kinds[kind] = outcome.device0_error_kinds.get(kind, 0) + count
        outcome.device0_first_errors += [
            f"{e['t'] - outcome.fault_sent_at:+.3f} s {e['error']}" for e in loop["first_errors"]
        ]
    outcome.device0_reattachments = sum(r["reattachments"] for r in loops)


def fault_phase(
    target: str,
    *,
    loopers: int,
    n: int,
    lead: float,
    tail: float,
    probe_timeout: float = 30.0,
    ready_timeout: float = 120.0,
) -> FaultOutcome:
    """Run phase C against the daemon at ``target`` (two devices, the faulty catalog).

    ``lead``: seconds the loops run before the fault; ``tail``: after the two-device client's
    checks. The probe and the two-device client use at most 65536 elements.
    """
    outcome = FaultOutcome(loopers=loopers, n=n, probe_n=min(n, 1 << 16))
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(Pool(_loop_specs(target, loopers, n)))
        faulting, probe, both = (
            stack.enter_context(Client(target, client_name=f"two-devices-{name}", timeout=TIMEOUT))
            for name in ("fault", "probe", "both")
        )
        scans = {d: ScanClient(both, d, outcome.probe_n) for d in (0, 1)}
        for device, scan in scans.items():
            scan.check_fully(device)
        before = probe.status().instance_id
        pool.ready(ready_timeout)
        began = pool.go()
        time.sleep(lead)
        answered = _fault(outcome, faulting)
        back = _probe(outcome, probe, answered, probe_timeout)
        _use_both(outcome, both, scans)
        time.sleep(tail)
        pool.stop()
        stopped = time.monotonic()
        loops = pool.results(timeout=TIMEOUT + 30)
        status = probe.status()
        outcome.status_after = status.to_dict()
        outcome.instance_changed = status.instance_id != before
        outcome.serving_after = status.serving
        outcome.devices_listed = listed_devices(outcome.status_after)
        outcome.reattachments = {
            "fault": faulting.reattachments,
            "probe": probe.reattachments,
            "both": both.reattachments,
        }
    cuts = [began, outcome.fault_sent_at, back if back is not None else stopped, stopped]
    _count_loops(outcome, loops, cuts)
    return outcome
