"""The sharing benchmark's report: the launch goals as ratios, and the markdown tables."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from accy._table import markdown

Path = tuple[str, ...]


def crowd_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """K client processes' results as one: kernels/s together, the slowest client over the
    mean, each client's rate; where they timed waited launches, the median client's p50 and
    the worst client's p99 (bench/contention.py, bench/scale.py)."""
    rates = [r["per_second"] for r in results]
    found: dict[str, Any] = {
        "per_second": sum(rates),
        "slowest_over_mean": min(rates) / statistics.mean(rates),
        "per_process": rates,
    }
    latencies = [r["latency"] for r in results if "latency" in r]
    if latencies:
        found["p50_us"] = statistics.median(x["p50_us"] for x in latencies)
        found["p99_us"] = max(x["p99_us"] for x in latencies)
    return found


@dataclass(frozen=True)
class Goal:
    """accy's number (``ours``) against a baseline's (``theirs``; None: an absolute goal)."""

    what: str
    ours: Path
    theirs: Path | None
    better: str  # "<=" or ">="
    bound: float


_RTT = ("baselines", "in_process", "round_trip", "p50_us")


def _mps(accy: str, mps: str, what: str, bound: float) -> Goal:
    return Goal(what, ("accy", accy, "per_second"), ("baselines", mps, "per_second"), ">=", bound)


GOALS = (
    Goal(
        "same-host round trip (tiny kernel, p50) / in-process launch + sync",
        ("accy", "round_trip", "launch", "p50_us"),
        _RTT,
        "<=",
        1.5,
    ),
    Goal(
        "one client, wait=False (short kernel) / in-process loop, one stream",
        ("accy", "one_client", "per_second"),
        ("baselines", "in_process", "one_stream", "short", "per_second"),
        ">=",
        0.9,
    ),
    _mps(
        "clients_long_waited", "mps_long_waited", "8 clients, each launch waited (long) / MPS", 0.9
    ),
    _mps(
        "clients_short_waited",
        "mps_short_waited",
        "8 clients, each launch waited (short) / MPS",
        0.6,
    ),
    _mps("clients_long", "mps_long", "8 clients, a wait every 16 (long) / MPS", 0.95),
    _mps("clients_short", "mps_short", "8 clients, a wait every 16 (short) / MPS", 0.45),
    _mps("clients_long", "mps_long", "moonshot: 8 clients, a wait every 16 (long) / MPS", 1.0),
    _mps("clients_short", "mps_short", "moonshot: 8 clients, a wait every 16 (short) / MPS", 1.0),
    Goal(
        "remote (TCP), one client, wait=False (waited every 256): launches/s",
        ("accy", "remote_rate", "per_second"),
        None,
        ">=",
        75_000,
    ),
    Goal(
        "remote (TCP) round trip (p50) / raw streaming gRPC echo of the same size",
        ("accy", "remote_round_trip", "launch", "p50_us"),
        ("accy", "remote_round_trip", "stream_echo", "p50_us"),
        "<=",
        1.5,
    ),
    Goal(
        "device_scan n=5000 waited (p50) / in-process launch + sync",
        ("accy", "scan", "p50_us"),
        _RTT,
        "<=",
        1.5,
    ),
)


def lookup(report: dict[str, Any], path: Path) -> float | None:
    """The number at ``path``, or None when a series is missing, failed or not positive."""
    node: Any = report
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, int | float) and node > 0 else None


def ratios(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per goal: accy's value, the baseline's, the ratio and whether it is met."""
    rows = []
    for goal in GOALS:
        ours = lookup(report, goal.ours)
        theirs = lookup(report, goal.theirs) if goal.theirs is not None else 1.0
        value = ours / theirs if ours is not None and theirs is not None else None
        met = None
        if value is not None:
            met = value <= goal.bound if goal.better == "<=" else value >= goal.bound
        rows.append(
            {
                "goal": goal.what,
                "accy": ours,
                "baseline": theirs if goal.theirs is not None else None,
                "value": value,
                "target": f"{goal.better} {goal.bound:g}",
                "met": met,
            }
        )
    return rows


def _unit(path: Path | None) -> str:
    if path is None:
        return ""
    return " µs" if path[-1].endswith("_us") else "/s" if path[-1] == "per_second" else ""


def cell(value: float | None, digits: int = 1) -> str:
    """A table cell: ``value`` with thousands separators and ``digits`` decimals, or ``-``."""
    return "-" if value is None else f"{value:,.{digits}f}"


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value:,.0f}{unit}"
    return f"{value:.3g}{unit}" if value < 10 else f"{value:.1f}{unit}"


def series_table(report: dict[str, Any]) -> str:
    """Every series' headline number (kernels/s, or p50 / p99 µs)."""
    rows: list[list[str]] = []
    for part in ("baselines", "accy"):
        if isinstance(report.get(part, {}).get("error"), str):
            rows.append([part, f"failed: {report[part]['error'].splitlines()[0][:120]}"])
            continue
        for name, found in report.get(part, {}).items():
            if not isinstance(found, dict):
                continue
            for label, value in _headlines(found):
                rows.append([f"{part}: {name}{label}", value])
    return markdown(["series", "value"], rows)


def _headlines(found: dict[str, Any]) -> list[tuple[str, str]]:
    if "error" in found:
        return [("", f"failed: {str(found['error']).splitlines()[0][:80]}")]
    out = []
    if "per_second" in found:
        out.append(("", f"{found['per_second']:,.0f} kernels/s"))
    if "p50_us" in found:
        out.append(("", f"{found['p50_us']:.1f} / {found['p99_us']:.1f} µs (p50 / p99)"))
    for key, value in found.items():
        if not isinstance(value, dict):
            continue
        if "p50_us" in value:
            out.append((f" {key}", f"{value['p50_us']:.1f} / {value['p99_us']:.1f} µs"))
        elif "per_second" in value:
            out.append((f" {key}", f"{value['per_second']:,.0f} kernels/s"))
        for kernel, inner in value.items():
            if isinstance(inner, dict) and "per_second" in inner:
                out.append((f" {key} {kernel}", f"{inner['per_second']:,.0f} kernels/s"))
            elif isinstance(inner, dict) and "us" in inner:
                out.append((f" {key} {kernel}", f"iters={inner['iters']}: {inner['us']:.2f} µs"))
    return out


def goals_table(report: dict[str, Any]) -> str:
    """The launch goals: accy, the baseline, the ratio, the target, met or not."""
    rows = []
    for goal, row in zip(GOALS, report["ratios"], strict=True):
        met = {True: "yes", False: "no", None: "-"}[row["met"]]
        rows.append(
            [
                row["goal"],
                _number(row["accy"], _unit(goal.ours)),
                _number(row["baseline"], _unit(goal.theirs)),
                _number(row["value"]),
                row["target"],
                met,
            ]
        )
    return markdown(["goal", "accy", "baseline", "ratio / value", "goal", "met"], rows)
