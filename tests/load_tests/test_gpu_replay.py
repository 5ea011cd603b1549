"""`streamrag bench gpu-replay --device cpu --small`: the paper-scale GPU replay's dry run, through the CLI as
scripts/gpu_replay.sh runs it, on the committed token traces scaled down. Both workloads, streaming and not,
must answer every query and write the keys the lead's report reads. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from load_tests.gpu_replay import PAPER, TRACE_DIR
from load_tests.synth.published import PUBLISHED
from load_tests.token_traces import TokenChunk, TokenQuery, TokenTrace, read_token_trace, write_token_trace
from streamrag.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)   # a tiny model, a few queries in real time: well under a minute on an idle machine
def test_gpu_replay_dry_run_answers_every_query_in_both_modes(tmp_path):
    out = tmp_path / "replay.json"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "streamrag.cli", "bench", "gpu-replay", "--device", "cpu", "--small",
                          "--max-queries", "3", "--json", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("gpu", "shape", "tensor_parallel", "token_budget", "kv_blocks", "warmup_s", "paper", "workloads",
                "runs", "ratios", "seconds"):
        assert key in result, key
    assert result["paper"] == PAPER
    assert {(r["workload"], r["streaming"]) for r in result["runs"]} == {
        (w, s) for w in ("crawler", "anns") for s in (True, False)}
    for row in result["runs"]:
        assert row["answered"] == row["queries"] == 3, row
        assert all(r["ttft_s"] is not None and r["ttft_from_arrival_s"] >= r["ttft_s"] for r in row["records"])
        assert row["ttft_p50_s"] is not None and row["ttft_from_arrival_p95_s"] is not None
    for workload in ("crawler", "anns"):
        ratios = result["ratios"][workload]
        assert ratios["headline"] is not None and ratios["headline_at"] == ("p50" if workload == "crawler" else "p95")
        assert result["workloads"][workload]["trace"]["queries"] == 3
    assert "| workload | QPS | mode |" in run.stdout


def test_the_committed_traces_are_at_the_papers_scale():
    for workload in ("crawler", "anns"):
        trace = read_token_trace(TRACE_DIR / f"{workload}.jsonl")
        assert trace.meta["token_scale"] == 1 and trace.meta["time_scale"] == 1
        stats = trace.statistics()
        published = PUBLISHED[workload]
        assert stats["queries"] >= 30
        assert 0.5 < stats["tokens_mean"] / published["tokens_per_query"]["mean"] < 2, stats
        assert 0.3 < stats["retrieval_mean_s"] / published["retrieval_latency_s"]["mean"] < 3, stats
    anns = read_token_trace(TRACE_DIR / "anns.jsonl")
    assert all(c.mode == "update" for q in anns.queries for c in q.chunks)


def test_a_token_trace_reads_back_and_scales(tmp_path):
    query = TokenQuery("q1", (TokenChunk(0.5, "update", (("a", 100), ("b", 50))),
                              TokenChunk(1.5, "update", (("a", 100), ("c", 80), ("d", 10)))))
    path = tmp_path / "t.jsonl"
    write_token_trace(path, TokenTrace("anns", (query,), {"seed": 3}))
    trace = read_token_trace(path)
    assert trace.queries == (query,) and trace.meta == {"seed": 3}
    assert query.tokens == 190 and query.peak_tokens == 190 and query.duration_s == 1.5
    small = query.scaled(0.1, 0.1)
    assert small.tokens == 10 + 8 + 1 and small.duration_s == pytest.approx(0.15)


def test_a_malformed_token_trace_names_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"format": "streamrag-token-trace", "version": 1, "workload": "anns"}\n'
                    '{"query_id": "q", "chunks": [{"t_s": 1, "mode": "swap", "docs": []}]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2: chunks\[0\].mode"):
        read_token_trace(path)


def test_gpu_replay_refuses_a_full_run_on_the_cpu(capsys):
    assert main(["bench", "gpu-replay", "--device", "cpu"]) == 2
    assert "--device cpu --small" in capsys.readouterr().err
