"""Progress lines for long work (benchmarks, trace recording): one place, so every command
reports the same way, on stderr (stdout carries tables and JSON) and flushed at once."""

from __future__ import annotations

import sys


def say(line: str) -> None:
    """Print one progress or error line to stderr, flushed."""
    print(line, file=sys.stderr, flush=True)
