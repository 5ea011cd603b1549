"""`load_tests/locustfile.py` run the way people run it: `locust --headless` as a subprocess,
against the real stack of tests/e2e (Redis, retrievers, the real model, the orchestrator). The
CSV must hold the custom TTFT / total rows for both modes with requests and no failures; a
bad address must end as recorded failures, not a crash or a hang. No timing thresholds."""

from __future__ import annotations

import csv
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "load_tests" / "locustfile.py"
METRICS = [f"Ask {mode} {what}" for mode in ("stream", "no-stream")
           for what in ("TTFT", "TTFT after retrieval", "total")]


@pytest.fixture(scope="module")
def stack(embedded_model_dir, tmp_path_factory):
    stack = Stack(embedded_model_dir, tmp_path_factory.mktemp("stack"))
    yield stack
    stack.stop()


def run_locust(out: Path, host: str, run_time: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run locust headless with 2 users and return the process and the stats CSV's rows by name."""
    prefix = out / "locust"
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", "2", "-r", "2",
               "-t", run_time, "--host", host, "--csv", str(prefix), "--only-summary",
               "--ask-wait-min", "0.1", "--ask-wait-max", "0.3", "--ask-max-tokens", "8", *extra]
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    stats_csv = Path(f"{prefix}_stats.csv")
    assert stats_csv.exists(), process.stdout[-3000:] + process.stderr[-3000:]
    with stats_csv.open(newline="") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    return process, rows


def test_headless_run_reports_ttft_and_total_for_both_modes(stack, tmp_path):
    process, rows = run_locust(tmp_path, f"127.0.0.1:{stack.orchestrator_port}", "10s", "--ask-retriever", "anns")
    log = process.stdout[-3000:] + process.stderr[-3000:]
    assert process.returncode == 0, log
    for name in METRICS:
        assert name in rows, (name, sorted(rows), log)
        assert int(rows[name]["Request Count"]) > 0, (name, rows[name])
        assert int(rows[name]["Failure Count"]) == 0, (name, rows[name], log)
        assert float(rows[name]["Median Response Time"]) > 0, (name, rows[name])
    assert int(rows["Aggregated"]["Failure Count"]) == 0
    # Users stopped mid-Ask cancel their calls: the engine ends with every KV block free.
    stack.inference.wait_until_all_blocks_free()


def test_unreachable_orchestrator_is_recorded_as_failures(tmp_path):
    with socket.socket() as probe:          # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process, rows = run_locust(tmp_path, f"127.0.0.1:{port}", "3s")
    assert process.returncode == 1, process.stderr[-3000:]     # locust's exit code when requests failed
    totals = [rows[name] for name in ("Ask stream total", "Ask no-stream total") if name in rows]
    assert totals, sorted(rows)
    for row in totals:
        assert int(row["Request Count"]) > 0 and row["Failure Count"] == row["Request Count"], row
    assert not any("TTFT" in name for name in rows), sorted(rows)
    with Path(f"{tmp_path / 'locust'}_failures.csv").open(newline="") as f:
        assert any("UNAVAILABLE" in row["Error"] for row in csv.DictReader(f))
