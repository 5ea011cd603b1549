"""Several arrival seeds combine into medians and spreads."""

from __future__ import annotations

import json

from load_tests.seeds import combine, main


def config(streaming: bool, p50: float, speedup: float | None, recomputes: int = 0) -> dict:
    ttft = {"p50": p50, "p95": 2 * p50, "p99": 3 * p50, "mean": p50}
    return {"engine": "native", "workload": "anns", "policy": "fcfs", "eviction": "cost", "qps": 0.333,
            "streaming": streaming, "ttft_s": ttft, "tokens_computed_total": 100, "tokens_invalidated_total": 5,
            "trace_completion_s": 10.0, "preemptions": {"recompute": recomputes, "swap": 1},
            "speedup_vs_nonstreaming": {k: speedup for k in ("p50", "p95", "p99")} if speedup else None}


def test_median_and_spread_per_configuration():
    runs = [[config(True, 1.0, 2.0, recomputes=4), config(False, 2.0, 1.0)],
            [config(True, 1.5, 0.8, recomputes=9), config(False, 1.2, 1.0)],
            [config(True, 0.5, 3.0, recomputes=6), config(False, 1.5, 1.0)]]
    rows = {r["streaming"]: r for r in combine(runs)}
    assert rows[True]["seeds"] == 3
    assert rows[True]["speedup_p50"] == {"median": 2.0, "min": 0.8, "max": 3.0}
    assert rows[True]["ttft_p50"] == {"median": 1.0, "min": 0.5, "max": 1.5}
    assert (rows[True]["preemptions_recompute"], rows[True]["preemptions_swap"]) == (6, 1)


def test_the_command_reads_summaries_and_refuses_a_missing_one(tmp_path, capsys):
    for seed in range(2):
        run = tmp_path / f"seed-{seed}"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"configs": [config(True, 1.0 + seed, 2.0)]}))
    assert main([str(tmp_path / "seed-0"), str(tmp_path / "seed-1"), "--label", "after"]) == 0
    out = capsys.readouterr().out
    assert "2.00 (2.00-2.00)" in out and "| 0 / 1 |" in out
    assert (tmp_path / "seeds.json").is_file()
    assert main([str(tmp_path / "nope")]) == 2
