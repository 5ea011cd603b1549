"""Several arrival seeds of `bench replay --seeds` combine into medians and spreads, and into peer ratios."""

from __future__ import annotations

from load_tests.replay_seeds import combine, peer_ratios, render


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


def test_the_table_and_the_peer_ratios_show_every_seed():
    runs = [[config(True, 1.0 + seed, 2.0), config(False, 2.0 + seed, None)] for seed in range(2)]
    table = render(combine(runs), label="after")
    assert "**after**" in table and "2.00 (2.00-2.00)" in table and "| 0 / 1 |" in table
    for configs in runs:
        for c in configs:
            c.update(policy="fcfs", requests=30)
    lines = peer_ratios(runs)
    assert lines[-4] == "median (min-max) over 2 seed(s):"
    assert lines[-1].startswith("    native fcfs-S vs native-NS p99: ")
