"""`bench replay` on a tiny hand-written trace: both workloads, streaming and not, against the real
Inference service started as a subprocess. Checks the files, the fields and that the numbers are sane
and come from the same run; no timing thresholds."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from load_tests.plots import ccdf, config_label, write_plots
from load_tests.replay import add_bench_replay_args, run_bench_replay, service_flags
from load_tests.replay_run import final_documents, poisson_arrivals, scale_query
from load_tests.report import BASELINE_ONCE_KEYS, add_speedups, render_report
from retriever_svc.replay.trace import TraceChunk, TraceDocument, TraceHeader, TraceQuery, read_trace, write_trace
from servicekit.stats import percentile

SENTENCE = ("generators yield values lazily while a list comprehension builds a whole list at once and "
            "the with statement closes files even when the block raises an exception")
WORDS = SENTENCE.split(" ")
QUERIES_PER_WORKLOAD = 3


def _doc(name: str, n: int) -> TraceDocument:
    text = " ".join(WORDS[(n + i) % len(WORDS)] for i in range(24))
    return TraceDocument(id=name, title=name, text=f"{name}: {text}.")


def tiny_trace(path: Path) -> Path:
    queries = []
    for q in range(QUERIES_PER_WORKLOAD):
        docs = [_doc(f"crawl-{q}-{i}", q + i) for i in range(3)]
        queries.append(TraceQuery(f"c{q}", f"What does the with statement do, case {q}?", "crawler", "synthesized", (
            TraceChunk(0.05, "append", False, (docs[0],)),
            TraceChunk(0.15, "append", False, (docs[1],)),
            TraceChunk(0.30, "append", False, (docs[2],)),
            TraceChunk(0.35, "append", True, ()))))
    for q in range(QUERIES_PER_WORKLOAD):
        a, b, c = (_doc(f"ann-{q}-{i}", 2 * q + i) for i in range(3))
        queries.append(TraceQuery(f"a{q}", f"How do generators work, case {q}?", "anns", "synthesized", (
            TraceChunk(0.02, "update", False, (a, c)),
            TraceChunk(0.06, "update", False, (a, b)),
            TraceChunk(0.10, "update", True, (b, a, c)))))
    return write_trace(path, queries, TraceHeader(generator="test", time_scale=0.01))


def test_helpers() -> None:
    arrivals = poisson_arrivals(5, 2.0, seed=1)
    assert arrivals[0] == 0 and arrivals == sorted(arrivals) and arrivals == poisson_arrivals(5, 2.0, seed=1)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and math.isnan(percentile([], 50))
    query = TraceQuery("x", "q", "anns", "synthesized", (
        TraceChunk(0.0, "append", False, (TraceDocument("d1"),)),
        TraceChunk(0.1, "update", False, (TraceDocument("d2"), TraceDocument("d3"))),
        TraceChunk(0.2, "append", True, (TraceDocument("d4"),))))
    assert [d.id for d in final_documents(query)] == ["d2", "d3", "d4"]
    configs = [{"engine": "native", "workload": "w", "policy": "fcfs", "eviction": "cost", "qps": 1.0,
                "streaming": s, "ttft_s": {"p50": t, "p95": t, "p99": t}} for s, t in ((True, 0.5), (False, 2.0))]
    add_speedups(configs)
    assert configs[0]["speedup_vs_nonstreaming"]["p50"] == pytest.approx(4.0)
    assert configs[1]["speedup_vs_nonstreaming"] == {"p50": 1.0, "p95": 1.0, "p99": 1.0}


@pytest.mark.slow   # half a minute of a bench (`bash scripts/test.sh --run-slow`)
def test_tiny_replay(tmp_path: Path, embedded_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tiny_trace(tmp_path / "tiny.jsonl")
    assert len(read_trace(trace).queries) == 2 * QUERIES_PER_WORKLOAD
    parser = argparse.ArgumentParser()
    add_bench_replay_args(parser)
    out = tmp_path / "out"
    args = parser.parse_args(["--trace", str(trace), "--qps", "2", "--policies", "fcfs", "--eviction", "cost",
                              "--model", str(embedded_model_dir), "--dtype", "float32", "--token-budget", "256",
                              "--out", str(out)])
    assert run_bench_replay(args) == 0
    err = capsys.readouterr().err
    assert "replaying 3 queries" in err and "requests done" in err

    summary = json.loads((out / "summary.json").read_text())
    configs = summary["configs"]
    keys = {(c["workload"], c["streaming"]) for c in configs}
    assert keys == {("crawler", True), ("crawler", False), ("anns", True), ("anns", False)} and len(configs) == 4
    for c in configs:
        for name in ("engine", "policy", "eviction", "streaming", "qps", "ttft_s", "ttft_from_arrival_s",
                     "speedup_vs_nonstreaming", "preemptions", "tokens_invalidated_total", "trace_completion_s",
                     "requests"):
            assert name in c, name
        assert (c["engine"], c["policy"], c["eviction"], c["qps"]) == ("native", "fcfs", "cost", 2.0)
        assert c["requests"] == QUERIES_PER_WORKLOAD and c["failed"] == 0
        for metric in ("ttft_s", "ttft_from_arrival_s", "speedup_vs_nonstreaming"):
            assert set(c[metric]) >= {"p50", "p95", "p99"}
            assert all(c[metric][p] > 0 for p in ("p50", "p95", "p99")), (metric, c[metric])
        assert c["ttft_from_arrival_s"]["p50"] >= c["ttft_s"]["p50"] - 1e-9
        assert set(c["preemptions"]) == {"recompute", "swap"}
        assert c["tokens_invalidated_total"] >= 0 and c["trace_completion_s"] > 0
        engine = c["engine_counters"]   # the service's own counters over this configuration's replay
        assert engine["generated_tokens"] == QUERIES_PER_WORKLOAD
        assert engine["prompt_tokens_computed"] + engine["prefix_cache_hit_tokens"] >= c["prompt_tokens_total"] > 0
        if not c["streaming"]:
            assert engine["prompt_tokens_computed"] + engine["prefix_cache_hit_tokens"] == c["prompt_tokens_total"]
            assert c["speedup_vs_nonstreaming"] == {"p50": 1.0, "p95": 1.0, "p99": 1.0}
            assert c["tokens_invalidated_total"] == 0
    for workload in ("crawler", "anns"):
        s, ns = (next(c for c in configs if c["workload"] == workload and c["streaming"] is flag)
                 for flag in (True, False))
        for p in ("p50", "p95", "p99"):
            assert s["speedup_vs_nonstreaming"][p] == pytest.approx(ns["ttft_s"][p] / s["ttft_s"][p], rel=1e-9)

    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(requests) == 4 * QUERIES_PER_WORKLOAD
    for r in requests:
        assert r["error"] is None and r["first_token_s"] >= r["last_chunk_s"] >= r["arrival_s"] >= 0
        assert r["prompt_tokens"] > 0 and r["generated_tokens"] == 1
    # the streamed and whole prompts are the same tokens
    by_query = {}
    for r in requests:
        by_query.setdefault(r["query_id"], set()).add(r["prompt_tokens"])
    assert all(len(v) == 1 for v in by_query.values()), by_query

    report = (out / "report.md").read_text()
    assert report == render_report(summary)
    for text in ("## Workload: crawler", "## Workload: anns", "Table 3 shape", "Table 4 shape", "fcfs/cost streaming"):
        assert text in report
    # the paper's figures: CCDF and TTFT-vs-QPS per workload, tokens invalidated for the update workload only
    assert set(summary["plots"]) == {"ttft_ccdf_crawler.png", "ttft_vs_qps_crawler.png", "ttft_ccdf_anns.png",
                                     "ttft_vs_qps_anns.png", "invalidated_ccdf_anns.png"}
    for name in summary["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"![{name}]({name})" in report


def test_delay_multiplier_stretches_the_gaps_not_the_first_chunk() -> None:
    query = TraceQuery("x", "q", "crawler", "synthesized", (
        TraceChunk(2.0, "append", False, (TraceDocument("d1"),)),
        TraceChunk(2.5, "append", False, (TraceDocument("d2"),)),
        TraceChunk(4.0, "append", True, ())))
    assert [c.t_s for c in scale_query(query, 10.0).chunks] == [2.0, 7.0, 22.0]
    assert scale_query(query, 1.0) is query


def test_one_baseline_pairs_with_every_policy() -> None:
    def entry(policy: str, streaming: bool, ttft: float) -> dict:
        return {"engine": "native", "workload": "w", "policy": policy, "eviction": "cost", "qps": 1.0,
                "streaming": streaming, "ttft_s": {"p50": ttft, "p95": ttft, "p99": ttft}}

    configs = [entry("fcfs", True, 0.5), entry("fcfs", False, 2.0), entry("lcas", True, 0.25)]
    add_speedups(configs, pair_keys=BASELINE_ONCE_KEYS)
    assert [c["speedup_vs_nonstreaming"]["p99"] for c in configs] == [pytest.approx(4.0), 1.0, pytest.approx(8.0)]
    add_speedups(configs)                                    # per configuration: lcas has no baseline
    assert configs[2]["speedup_vs_nonstreaming"]["p99"] is None


def test_plots_draw_ccdfs_from_request_rows(tmp_path: Path) -> None:
    assert ccdf([3.0, 1.0, 2.0]) == ([1.0, 2.0, 3.0], [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3)])
    rows = [{"engine": "native", "policy": "fcfs", "eviction": "cost", "qps": qps, "workload": "anns",
             "streaming": streaming, "ttft_s": 0.1 * (i + 1), "tokens_invalidated": 10 * i, "error": None}
            for qps in (0.5, 1.0) for streaming in (True, False) for i in range(5)]
    rows.append({**rows[0], "error": "UNAVAILABLE: gone", "ttft_s": None})     # failed requests are left out
    written = write_plots(rows, tmp_path, update_workloads={"anns"})
    assert [p.name for p in written] == ["ttft_ccdf_anns.png", "ttft_vs_qps_anns.png", "invalidated_ccdf_anns.png"]
    assert config_label(rows[0]) == "fcfs/cost streaming"
    assert config_label({**rows[0], "engine": "vllm", "streaming": False}, engines=2) == "vllm fcfs/cost non-streaming"


def test_vllm_engine_without_vllm_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--engine vllm` with an interpreter that lacks vllm: exit 1 and a message, no traceback."""
    import sys

    parser = argparse.ArgumentParser()
    add_bench_replay_args(parser)
    args = parser.parse_args(["--trace", str(tiny_trace(tmp_path / "tiny.jsonl")), "--qps", "1", "--engine", "vllm",
                              "--vllm-python", sys.executable, "--out", str(tmp_path / "out")])
    assert run_bench_replay(args) == 1
    err = capsys.readouterr().err
    assert "error: the vLLM inference service did not start" in err and "needs vllm" in err


def test_vllm_engine_refuses_an_eviction_mode_it_cannot_honour_before_any_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--engine native,vllm --eviction recompute,cost`: the same lists as native; cost is refused by
    name before anything starts (no silent fallback to recompute)."""
    import sys

    parser = argparse.ArgumentParser()
    add_bench_replay_args(parser)
    args = parser.parse_args(["--trace", str(tiny_trace(tmp_path / "tiny.jsonl")), "--qps", "1",
                              "--engine", "native,vllm", "--policies", "fcfs,lcas", "--eviction", "recompute,cost",
                              "--vllm-python", sys.executable, "--out", str(tmp_path / "out")])
    assert run_bench_replay(args) == 1
    err = capsys.readouterr().err
    assert "--engine vllm: --eviction 'cost' cannot be honoured on --backend vllm" in err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_vllm_block_size_goes_to_the_vllm_service_only(tmp_path: Path) -> None:
    """`--vllm-block-size 128` (a small pool on vLLM's CPU, docs/vllm.md) reaches `serve inference
    --backend vllm` and leaves the native engine's block size alone."""
    parser = argparse.ArgumentParser()
    add_bench_replay_args(parser)
    args = parser.parse_args(["--trace", str(tmp_path / "t.jsonl"), "--qps", "1", "--kv-device-blocks", "66",
                              "--vllm-block-size", "128", "--out", str(tmp_path / "out")])
    vllm = service_flags(args, "vllm", "recompute")
    assert vllm[vllm.index("--block-size") + 1] == "128" and "--kv-device-blocks" in vllm
    assert "--block-size" not in service_flags(args, "native", "cost")
    default = parser.parse_args(["--trace", str(tmp_path / "t.jsonl"), "--qps", "1", "--out", str(tmp_path / "out")])
    assert "--block-size" not in service_flags(default, "vllm", "recompute")
