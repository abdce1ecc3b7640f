"""Text tables and human units for the CLI and the benchmark."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["bytes_text", "markdown", "plain", "rate_text", "seconds_text"]


def plain(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, for a terminal."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines.extend("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)


def seconds_text(seconds: float) -> str:
    """``12.3 µs``, ``4.56 ms`` or ``1.23 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def bytes_text(count: float) -> str:
    """``512 B``, ``4.0 MiB``, ``1.00 GiB``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{int(count)} B"


def rate_text(count: float, seconds: float) -> str:
    """Bytes per second in decimal units (``1.23 GB/s``)."""
    if seconds <= 0:
        return "-"
    rate = count / seconds
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.2f} {unit}"
    return f"{rate:.0f} B/s"
