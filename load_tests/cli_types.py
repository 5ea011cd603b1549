"""What the benchmark CLIs share: argparse types for their numbers and lists, and how they write --json.

Standard library only. A bad value is an argparse error (`streamrag bench ...: error: argument
--seeds: ...`), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """A comma-separated list of integers >= 0 ("0,1,2"), at least one."""
    items = [part.strip() for part in text.split(",")]
    if not items or any(not part.isdigit() for part in items):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 0, got {text!r}")
    return [int(part) for part in items]


def positive_int_list(text: str) -> list[int]:
    """A comma-separated list of integers >= 1."""
    values = int_list(text)
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}")
    return values


def write_json(path: Path, data: Any, **dumps: Any) -> None:
    """Write `data` as indented JSON (a trailing newline), creating the folder; `dumps` go to json.dumps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, **dumps) + "\n", encoding="utf-8")
