"""What every `streamrag bench` command shares: the CPU lock, seeds and their spread, JSON, plots.

A bench keeps only what it measures; the rest is here, written once:

- **The CPU lock.** Every `streamrag bench` command but `bench report` runs holding
  `/tmp/streamrag-cpu.lock` (an `fcntl` lock: `cpu_lock()`, taken by the CLI, streamrag/cli.py), so
  two benchmarks never share the cores. The holder sets `STREAMRAG_CPU_LOCKED=1` in its
  environment, so a bench it starts as a subprocess does not wait for its own parent.
  `STREAMRAG_CPU_LOCK=off` runs a bench without the lock: the test suite sets it (tests/conftest.py),
  so a test never waits on a user's benchmark, nor holds one up.
- **Seeds.** `add_seeds_arg` gives a bench its `--seeds 0,1,2`; `spread` is how every bench
  reports several seeds: the median with its min and max.
- **Flags.** The argparse types for numbers and lists (every list flag is comma-separated: `--seeds 0,1,2`,
  `--rates 0.25,0.5`, `--modes colocated,disaggregated`): a bad value is an argparse error naming the
  flag (`streamrag bench ...: error: argument --seeds: ...`), never a traceback.
- **Output.** `write_json` writes `--json`; `pyplot` and `save_figure` draw PNG plots (matplotlib is
  imported only when a plot is drawn, so a bench's flags stay light).

Standard library only at import.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

CPU_LOCK = Path("/tmp/streamrag-cpu.lock")
CPU_LOCKED_ENV = "STREAMRAG_CPU_LOCKED"     # "1": this process or its parent holds the lock
CPU_LOCK_ENV = "STREAMRAG_CPU_LOCK"         # "off": run without the lock (the test suite)


# ---------------------------------------------------------------------------- the CPU lock

@contextlib.contextmanager
def cpu_lock(path: Path = CPU_LOCK) -> Iterator[None]:
    """Hold the CPU lock for the block (waiting, with a note on stderr, while another bench holds it).
    Inside a holder (`STREAMRAG_CPU_LOCKED=1`) it is already held, and with `STREAMRAG_CPU_LOCK=off` it is
    not wanted: then this does nothing, and opens no lock file."""
    if os.environ.get(CPU_LOCKED_ENV) == "1" or os.environ.get(CPU_LOCK_ENV) == "off":
        yield
        return
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for the CPU lock ({path}): another benchmark holds it", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        os.environ[CPU_LOCKED_ENV] = "1"
        try:
            yield
        finally:
            del os.environ[CPU_LOCKED_ENV]
            fcntl.flock(lock, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------- seeds

def spread(values: Sequence[float], digits: int | None = None) -> dict[str, float]:
    """The median of per-seed values with their min and max: how every benchmark reports seeds
    (rounded to `digits` when given)."""
    values = list(values)
    out = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out if digits is None else {key: round(value, digits) for key, value in out.items()}


def add_seeds_arg(parser: argparse.ArgumentParser, default: str = "0,1,2", what: str = "seeds") -> None:
    """`--seeds 0,1,2`: the seeds a bench runs, each named in its JSON."""
    parser.add_argument("--seeds", type=int_list, default=int_list(default),
                        help=f"comma-separated {what} (default: {default})")


# ---------------------------------------------------------------------------- flags

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


def positive_float_list(text: str) -> list[float]:
    """A comma-separated list of numbers > 0 ("0.25,0.5"), at least one."""
    try:
        return [positive_float(part.strip()) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers > 0, got {text!r}") from None


def fraction_list(text: str) -> list[float]:
    """A comma-separated list of shares from 0 to 1 ("0,0.15,1"), at least one."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = [math.nan]
    if not all(0.0 <= value <= 1.0 for value in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers from 0 to 1, got {text!r}")
    return values


def choice_list(choices: Sequence[str]) -> Any:
    """An argparse type: a comma-separated list of some of `choices` ("colocated,disaggregated")."""
    def parse(text: str) -> list[str]:
        items = [part.strip() for part in text.split(",")]
        if not items or any(item not in choices for item in items):
            raise argparse.ArgumentTypeError(f"must be comma-separated, each one of {', '.join(choices)}; got {text!r}")
        return items
    return parse


# ---------------------------------------------------------------------------- output

def write_json(path: Path, data: Any, **dumps: Any) -> None:
    """Write `data` as indented JSON (a trailing newline), creating the folder; `dumps` go to json.dumps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, **dumps) + "\n", encoding="utf-8")


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only backend (no display on these machines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110, **savefig: Any) -> Path:
    """Write `fig` to `path` (creating the folder) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, **savefig)
    pyplot().close(fig)
    return path
