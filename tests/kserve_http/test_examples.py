"""tritonclient.http programs, written as Triton's simple_http_* examples are, against the
KServe HTTP door: a daemon without tokens, and one whose every call needs a token (the
program sends it as an ``authorization`` header)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.kserve.harness import Tools, run_program
from tests.kserve_http.conftest import HttpDaemon

PROGRAMS = Path(__file__).with_name("programs")
CASES = [
    ("http_health_metadata", ()),
    ("http_infer", ()),
    ("http_infer", ("--compression", "gzip")),
    ("http_infer", ("--compression", "deflate")),
    ("http_async_infer", ()),
    ("http_shm", ()),
]


@pytest.mark.parametrize("kind", ["plain", "guarded"])
@pytest.mark.parametrize(("program", "args"), CASES, ids=[" ".join([p, *a]) for p, a in CASES])
def test_example(
    tools: Tools,
    plain_http: HttpDaemon,
    guarded_http: HttpDaemon,
    http_tokens: tuple[Path, dict[str, str]],
    program: str,
    args: tuple[str, ...],
    kind: str,
) -> None:
    served = guarded_http if kind == "guarded" else plain_http
    token = http_tokens[1]["alpha"] if kind == "guarded" else None
    if program == "http_shm":  # its own object names: runs beside other tests' programs
        args = ("--suffix", f"_{os.getpid()}_{kind}")
    done = run_program(tools, program, served.http, token, *args, folder=PROGRAMS)
    assert "PASS" in done.stdout


def test_a_token_is_needed_where_the_daemon_has_tokens(
    tools: Tools, guarded_http: HttpDaemon
) -> None:
    """Without its token the same program is refused: 401, with the daemon's message."""
    done = subprocess.run(
        [str(tools.python), str(PROGRAMS / "http_infer.py"), "-u", guarded_http.http],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "[401]" in done.stderr and "token" in done.stderr, done.stderr
