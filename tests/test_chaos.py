"""`streamrag bench chaos` for real, short: two minutes of asks on the tiny corpus while one replica
is killed, one of the two orchestrators is killed and the other replica frozen, through the console
script on a stack it starts itself (fp32, two replicas, two orchestrators, every port a free one).

It asserts the behaviour the soak exists to show, not its timings: no ask hangs past its
deadline, every failed ask overlaps a fault's window, no ask fails for the orchestrator's kill (the
users resume as `streamrag ask` does), each faulted service comes back, no KV block is left held,
no event an acknowledged client saw is missing from the lifecycle store, every answer whose
documents match the fault-free pass equals it, and every answer's tokens arrived once each, in order.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.stack import STREAMRAG, processes_in


@pytest.mark.slow            # about 3 minutes: the longest test by far (`bash scripts/test.sh --run-slow`)
@pytest.mark.timeout(1500)
def test_a_short_soak_with_a_killed_replica_and_orchestrator_and_a_frozen_replica_meets_the_behavioural_targets(
        tiny_index: Path, run_dir: Path, tmp_path: Path):
    out = tmp_path / "chaos.json"
    bench = subprocess.run(
        [str(STREAMRAG), "bench", "chaos", "--run-dir", str(run_dir), "--duration", "2m", "--fault-every", "40s",
         "--faults", "kill:inference-0,kill:orchestrator,stop:inference-1", "--stop-for", "10s", "--users", "3",
         "--questions", "2", "--max-tokens", "8", "--deadline", "180s", "--replicas", "2", "--orchestrators", "2",
         "--dtype", "float32",
         "--corpus-root", str(tiny_index.parent / "site"), "--index", str(tiny_index), "--json", str(out)],
        capture_output=True, text=True, timeout=1400, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    log = bench.stdout[-6000:] + bench.stderr[-4000:]
    assert bench.returncode == 0, log
    report = json.loads(out.read_text())
    totals, rows = report["totals"], report["faults"]

    assert [(r["action"], r["target"]) for r in rows] == [("kill", "inference-0"), ("kill", "orchestrator"),
                                                          ("stop", "inference-1")], log
    assert report["settings"]["orchestrators"] == 2
    assert all(not r["error"] and r["down_s"] is not None for r in rows), rows     # each came back healthy
    assert totals["answered"] > 0 and report["answers"]["compared"] > 0, log
    assert totals["hung"] == 0, rows
    assert totals["failures_outside_windows"] == 0, report["outside_windows"]
    assert totals["leaked_blocks"] == 0, report["leaked"]
    assert totals["lost_events"] == 0, report["lost"]
    assert report["answers"]["differ"] == 0, report["answers"]["examples"]
    assert totals["crossed_differ"] == 0 and totals["out_of_order"] == 0, rows
    assert rows[1]["failed"] == 0, rows[1]             # the other orchestrator takes the asks over
    assert processes_in(run_dir) == [], "the stack the bench started outlived it"
