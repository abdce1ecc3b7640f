"""The shell examples of README.md and docs/*.md run as written on the host backend.

Every ```sh block is run with bash (`set -e`) in a folder of its own, accy's commands first
on PATH: each command in it runs, unless SKIPPED names it with the reason it cannot run here
(a GPU, a cluster, containers, or TLS files and programs a reader brings). tritonclient's
`python` and perf_analyzer are those scripts/kserve_tools.sh installs (CI's); without them,
the commands that need them are skipped with its message. What the test changes, and only
that: an `accyd serve` line starts the daemon in the background, as in a terminal of its own,
and the next line waits until it serves; loopback ports and `unix:/run/...` sockets are the
test's own, free ones; the default socket is under the test's XDG_RUNTIME_DIR; curl fails on
an HTTP error; perf_analyzer measures one window of 64 requests (as the perf_analyzer tests
do), not 5 s windows until they are stable. ```python blocks are listed in
PYTHON (tests/test_readme.py runs README's).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from accy.testing import free_port
from tests.kserve.harness import find_tools

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

GPU = "needs a GPU (the CUDA backend)"
K8S = "needs a Kubernetes cluster (scripts/container_test.sh plays the pod templates)"
CONTAINERS = "builds or runs containers: scripts/container_test.sh does, with podman"
TLS = "needs the reader's TLS files and tokens (tests/security runs the TLS cases)"
SKIPPED: dict[str, str] = {
    # The start of a command (a line, its continuations joined) -> why it does not run here.
    r"bash scripts/quickstart\.sh": "sets up the checkout's .venv with pip (CI: scripts/test.sh)",
    r"bash scripts/test\.sh": "the whole test suite, CI's own command",
    r"accyd serve --backend cuda": GPU,
    r"accy run accy\.kernel\.device_scan --n 268435456": GPU + ": the text says so (1 GiB)",
    r"accy run my\.pipeline": "the reader's own pipeline and x.npy",
    r"accyd serve --listen 0\.0\.0\.0:7447 --tokens": TLS,
    r"ACCY_TOKEN=accy_\.\.\. accy --target gpu-node": TLS + ", and another host",
    r"docker ": CONTAINERS,
    r"podman": CONTAINERS,
    r"kubectl ": K8S,
    r"accy --target accyd\.accy\.svc": K8S,
    r"check-jsonschema .* my-daemonset\.yaml": "the reader's manifest (lint_containers.sh "
    "runs the same check on deploy/k8s)",
}
KSERVE_TOOLS = [r"python - <<'PY'\nimport numpy as np, tritonclient", r"perf_analyzer "]
PYTHON = {
    "import numpy as np": "tests/test_readme.py runs it",
    "import asyncio": "tests/test_readme.py runs it",
    "import json, triton": "needs Triton-lang (bench/triton_catalog.py does the same steps)",
}


@dataclass(frozen=True)
class Example:
    path: Path
    line: int
    lang: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def examples(lang: str) -> list[Example]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, match.start()) + 1
            found.append(Example(path, line, lang, match.group(1)))
    return found


def commands(block: str) -> list[str]:
    """The block's logical lines: continuations joined, a here-document kept with its line."""
    lines = block.splitlines()
    out: list[str] = []
    while lines:
        line = lines.pop(0)
        while line.endswith("\\") and lines:
            line += "\n" + lines.pop(0)
        heredoc = re.search(r"<<-?'?(\w+)'?", line)
        if heredoc:
            while lines:
                body = lines.pop(0)
                line += "\n" + body
                if body.strip() == heredoc.group(1):
                    break
        out.append(line)
    return out


TOOLS = find_tools()


def skip_reason(command: str) -> str | None:
    for pattern, reason in SKIPPED.items():
        if re.match(pattern, command.strip()):
            return reason
    if isinstance(TOOLS, str) and any(re.match(p, command.strip()) for p in KSERVE_TOOLS):
        return TOOLS
    return None


def _own_addresses(block: str, tmp: Path) -> str:
    """``block`` with its loopback ports and /run sockets replaced by the test's own."""
    ports: dict[str, int] = {}
    block = re.sub(
        r"127\.0\.0\.1:(\d+)",
        lambda m: f"127.0.0.1:{ports.setdefault(m.group(1), free_port())}",
        block,
    )
    return re.sub(r"unix:/run/([\w.]+)", rf"unix:{tmp}/\1", block)


def runs(command: str) -> bool:
    """Whether the test runs ``command`` (neither a comment nor a skipped command)."""
    text = command.strip()
    return bool(text) and not text.startswith("#") and skip_reason(text) is None


def script(block: str) -> tuple[str, list[str]]:
    """The bash script that runs ``block``, and the reasons of the commands it leaves out."""
    lines = [
        "set -euo pipefail",
        "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT",
        "serving() {  # TARGET: wait until the daemon started last answers its health check",
        "  for _ in $(seq 300); do",
        '    accy ${1:+--target "$1"} health --timeout 1 >/dev/null 2>&1 && return 0',
        '    kill -0 "$!" 2>/dev/null || break; sleep 0.1',
        "  done",
        '  echo "accyd did not serve ${1:-on its default socket}:" >&2; cat accyd.log >&2; exit 1',
        "}",
    ]
    skipped = []
    for command in commands(block):
        reason = skip_reason(command)
        if reason is not None:
            shown = re.sub(r"\s+#\s.*$", "", command.splitlines()[0].strip())
            skipped.append(f"{shown}: {reason}")
            lines.append(": skipped")
        elif command.strip().startswith("accyd serve"):
            daemon = re.sub(r"\s+#\s.*$", "", command.strip())
            listen = re.search(r"--listen[ =](unix:\S+)", daemon)
            lines.append(f"{daemon} >>accyd.log 2>&1 &")
            lines.append(f"serving {listen.group(1) if listen else ''}")
        else:
            lines.append(command)
    return "\n".join(lines) + "\n", skipped


def _tools(tmp: Path) -> Path:
    """A folder for PATH: accy's commands, tritonclient's ``python`` and perf_analyzer where
    installed (its windows 1 s long), and a ``curl`` for which an HTTP error fails."""
    folder = tmp / "bin"
    folder.mkdir()
    programs = {"accy": Path(sys.executable).with_name("accy")}
    programs["accyd"] = programs["accy"].with_name("accyd")
    if not isinstance(TOOLS, str):
        programs |= {"python": TOOLS.python, "perf_analyzer": TOOLS.perf_analyzer}
    for name, program in programs.items():
        (folder / name).write_text(f'#!/bin/sh\nexec {program} "$@"\n')
    if "perf_analyzer" in programs:  # one window of 64 requests: the test's time, and no
        # "failed to obtain stable measurement" on a busy machine (windows of 1 s did that)
        (folder / "perf_analyzer").write_text(
            f'#!/bin/sh\nexec {programs["perf_analyzer"]} --request-count 64 "$@"\n'
        )
    curl = shutil.which("curl")
    if curl is not None:
        (folder / "curl").write_text(
            f'#!/bin/sh\nfor a; do case $a in --fail*|-[!-]*f*) exec {curl} "$@";; esac; done\n'
            f'exec {curl} --fail-with-body "$@"\n'
        )
    for program in folder.iterdir():
        program.chmod(0o755)
    return folder


SH = examples("sh")


@pytest.mark.parametrize("example", SH, ids=[e.name for e in SH])
def test_shell_example_runs(example: Example, tmp_path: Path) -> None:
    text, skipped = script(_own_addresses(example.text, tmp_path))
    if not any(runs(c) for c in commands(example.text)):
        pytest.skip("; ".join(skipped))
    for tool in ("curl", "openssl"):
        if re.search(rf"^\s*{tool} ", text, re.M) and shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCY_", "ACCYD_"))}
    env |= {"PATH": f"{_tools(tmp_path)}:{env['PATH']}", "XDG_RUNTIME_DIR": str(xdg)}
    run = subprocess.Popen(
        ["bash", "-c", text],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, f"{example.name} failed:\n{text}\n--- output\n{output}"


def test_every_skip_names_a_command_and_each_example_runs_something() -> None:
    shown = [c.strip() for e in SH for c in commands(e.text)]
    for pattern in [*SKIPPED, *KSERVE_TOOLS]:
        assert any(re.match(pattern, c) for c in shown), f"no example matches {pattern!r}"
    ran = [c for c in shown if runs(c)]
    assert len(ran) >= 8, ran


def test_every_python_example_is_run_or_listed() -> None:
    for example in examples("python"):
        first = example.text.lstrip().splitlines()[0]
        assert any(first.startswith(key) for key in PYTHON), f"{example.name}: {first!r}"
