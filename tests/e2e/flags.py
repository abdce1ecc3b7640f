"""Which flags this tree's ``accyd serve`` has, for tests of features that land separately."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

_MAIN = "import sys; from accyd.cli import main; sys.exit(main())"


@functools.cache
def serve_help() -> str:
    """The text of ``accyd serve --help``."""
    done = subprocess.run(
        [sys.executable, "-c", _MAIN, "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout


def needs_flag(flag: str) -> pytest.MarkDecorator:
    """Skip a test where ``accyd serve`` lacks ``flag`` (its feature has not landed)."""
    return pytest.mark.skipif(flag not in serve_help(), reason=f"accyd serve has no {flag}")
