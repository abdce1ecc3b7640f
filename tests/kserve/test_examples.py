"""tritonclient programs, written as its upstream examples call it, against the KServe door.

Each runs under tritonclient's own environment (``scripts/kserve_tools.sh``), on the
daemon's Unix socket and on TCP, against a daemon without tokens and one whose every
call needs a token (the program then sends it as an ``authorization`` header).
"""

from __future__ import annotations

import pytest

from accy.testing import RunningDaemon
from tests.kserve.harness import Tools, run_program, url_of

PROGRAMS = [
    ("health_metadata", ()),
    ("simple_infer", ()),
    ("simple_infer", ("--no-outputs",)),
    ("simple_async", ()),
    ("simple_stream", ()),
    ("statistics", ()),
    ("simple_shm", ()),
    ("saxpy", ()),
]


@pytest.mark.parametrize("transport", ["unix", "tcp"])
@pytest.mark.parametrize("kind", ["plain", "guarded"])
@pytest.mark.parametrize(
    ("program", "args"), PROGRAMS, ids=[" ".join([p, *a]) for p, a in PROGRAMS]
)
def test_example(
    tools: Tools,
    daemons: dict[str, RunningDaemon],
    tokens: dict[str, str],
    program: str,
    args: tuple[str, ...],
    kind: str,
    transport: str,
) -> None:
    token = tokens["alpha"] if kind == "guarded" else None
    done = run_program(tools, program, url_of(daemons[kind], transport), token, *args)
    assert "PASS" in done.stdout


def test_a_token_is_needed_where_the_daemon_has_tokens(
    tools: Tools, guarded: RunningDaemon
) -> None:
    """Without its token the same program is refused (UNAUTHENTICATED), on both transports."""
    import subprocess

    from tests.kserve.harness import PROGRAMS as FOLDER

    for transport in ("unix", "tcp"):
        done = subprocess.run(
            [str(tools.python), str(FOLDER / "simple_infer.py"), "-u", url_of(guarded, transport)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode != 0
        assert "UNAUTHENTICATED" in done.stderr or "Unauthenticated" in done.stderr, done.stderr
