"""A log line reaches its stream whole: processes sharing one stderr never split a line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import structlog

from accyd.logs import configure_logging


class Writes(io.StringIO):
    """A text stream that keeps each ``write`` call apart."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_each_line_is_one_write_with_its_newline() -> None:
    stream = Writes()
    try:
        configure_logging("json", "info", stream)
        log = structlog.get_logger("accyd.test.lines")
        log.info("first", client_id="alice")
        log.warning("second", session_id="s1")
    finally:
        configure_logging("console", "info", stdlib=True)
    assert len(stream.calls) == 2, stream.calls
    for call, event in zip(stream.calls, ["first", "second"], strict=True):
        assert call.endswith("\n") and call.count("\n") == 1
        assert json.loads(call)["event"] == event


WRITER = """
import sys
import structlog
from accyd.logs import configure_logging
configure_logging("json", "info")
log = structlog.get_logger("accyd.test.lines")
for number in range(int(sys.argv[2])):
    log.info("line", writer=sys.argv[1], number=number)
"""


def test_two_unbuffered_processes_on_one_stderr_keep_their_lines_whole(tmp_path: Path) -> None:
    lines = 3000
    sink_path = tmp_path / "shared.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with sink_path.open("wb") as sink:
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, name, str(lines)],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env=env,
            )
            for name in ("a", "b")
        ]
        assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    events = [json.loads(line) for line in sink_path.read_text().splitlines()]
    for name in ("a", "b"):
        numbers = [event["number"] for event in events if event["writer"] == name]
        assert numbers == list(range(lines))
