"""Run ``accy run PIPELINE --n N --check`` for every built-in pipeline and size against one daemon.

Run from the repository root:

    python bench/cli_checks.py [--backend auto|cuda|host] [--sizes N ...] [--repeat K]

It starts ``accyd serve`` on a temporary socket, runs the CLI as a user would
(a subprocess per pipeline and size), and prints a table of the checks and
timings last; the exit code is non-zero if any check failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from accy._table import markdown
from accy.testing import running_daemon

PIPELINES = ("accy.kernel.device_scan", "accy.kernel.reduce_sum", "accy.kernel.saxpy")


def check(target: str, pipeline: str, n: int, repeat: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "accy.cli", "--target", target, "run", pipeline]
    command += ["--n", str(n), "--check", "--repeat", str(repeat), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode not in (0, 1):
        return {"pipeline": pipeline, "n": n, "ok": False, "error": done.stderr.strip()[-300:]}
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["auto", "cuda", "host"], default="auto")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 5000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    all_ok = True
    with running_daemon(backend=args.backend, tcp=False) as daemon:
        for n in args.sizes:
            for pipeline in PIPELINES:
                report = check(daemon.unix_target, pipeline, n, args.repeat)
                ok = bool(report.get("ok"))
                all_ok &= ok
                errors = [c["error"] for c in report.get("check") or []]
                rows.append(
                    [
                        pipeline,
                        str(n),
                        report.get("backend", "?"),
                        "ok" if ok else f"FAILED {report.get('error', '')}",
                        f"{max(errors):.1e}" if errors else "-",
                        f"{report.get('launch_p50_seconds', 0) * 1e3:.2f} ms",
                        f"{report.get('upload_seconds', 0) * 1e3:.1f} ms",
                        f"{report.get('download_seconds', 0) * 1e3:.1f} ms",
                    ]
                )
    header = ["pipeline", "n", "backend", "check", "rel. error", "launch p50", "upload", "download"]
    print(markdown(header, rows))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
