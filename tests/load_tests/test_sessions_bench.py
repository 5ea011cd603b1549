"""`bench sessions` on a tiny configuration (two small points, one seed) with the real model and
the real service in-process: the JSON's shape, session queries that share the session's KV and
compute only their question, a defeated and then a hit prefix cache for the Generate baselines,
Flash hits, the table and the plot. No timing thresholds."""

from __future__ import annotations

import argparse
import json
import random

import pytest

from load_tests.sessions.summary import METRICS, format_table
from load_tests.sessions.workload import LogFeed, log_lines
from load_tests.sessions_bench import add_bench_sessions_args, run_bench_sessions


def test_the_log_is_deterministic_per_seed_and_segments_add_up_to_about_the_asked_tokens():
    first = [line for line, _ in zip(log_lines(random.Random(3)), range(50), strict=False)]
    again = [line for line, _ in zip(log_lines(random.Random(3)), range(50), strict=False)]
    other = [line for line, _ in zip(log_lines(random.Random(4)), range(50), strict=False)]
    assert first == again != other
    segments = LogFeed(0, lambda text: len(text.split())).take(300)
    assert all(text.endswith("\n") for text, _ in segments)
    assert abs(sum(n for _, n in segments) - 300) <= max(n for _, n in segments)


@pytest.mark.slow   # half a minute of a bench (`bash scripts/test.sh --run-slow`)
def test_bench_sessions_on_two_small_points(tmp_path, embedded_model_dir, capsys):
    parser = argparse.ArgumentParser()
    add_bench_sessions_args(parser)
    out = tmp_path / "sessions.json"
    args = parser.parse_args(["--model", str(embedded_model_dir), "--points", "400,700", "--seeds", "0",
                              "--questions", "2", "--warm-repeats", "1", "--flash-repeats", "2", "--no-vllm",
                              "--kv-device-blocks", "512", "--json", str(out)])
    assert run_bench_sessions(args) == 0
    result = json.loads(out.read_text())

    points = result["points"]
    assert len(points) == 2 and points[0]["context_tokens"] < points[1]["context_tokens"]
    for point in points:
        assert {"context_tokens", "session_query_ttft_ms", "generate_ttft_ms", "prefix_cache_ttft_ms",
                "flash_hit_ms"} <= point.keys()
        assert "vllm_prefix_cache_ttft_ms" not in point
        assert all(point[key] > 0 for key in METRICS if key in point)
        # the queries forked the session: every context token's KV shared, none computed again
        assert point["session_shared_tokens"] == point["session_context_tokens"] == point["context_tokens"]
    assert result["vllm_skipped"] == "--no-vllm"

    runs = result["runs"]
    assert [r["point"] for r in runs] == [400, 700] and all(r["seed"] == 0 for r in runs)
    for run in runs:
        assert run["session_tokens_computed"] < 40                       # the question, not the log
        assert len(run["session_query_ttfts_ms"]) == 2
        assert run["generate_prefix_hit_tokens"] <= 16                   # cold: at most the chat prefix's block
        assert run["prefix_cache_hit_tokens"] >= run["context_tokens"] - 16   # warm: the whole context but a block
        assert run["generate_prompt_tokens"] > run["context_tokens"]
        assert run["flash_answer"] and run["flash_eval_ms"] > 0
    assert runs[0]["data_version"] < runs[1]["data_version"]

    ratios = result["ratios"]
    assert set(ratios["targets_met"]) == {"session_query_growth_le_1.2", "speedup_vs_generate_ge_5",
                                          "speedup_vs_prefix_cache_ge_2.4", "flash_hit_server_lt_5ms"}
    assert ratios["session_query_growth"]["median"] > 0
    ingestion = result["ingestion"]
    assert ingestion["without_queries"]["tokens_per_s"]["median"] > 0
    assert ingestion["with_queries"]["tokens_per_s"]["median"] > 0
    assert 0 < sum(r["tokens"] for r in result["ingestion_runs"]) <= points[-1]["context_tokens"]

    assert out.with_suffix(".png").stat().st_size > 0
    table = capsys.readouterr().out
    assert table.startswith(format_table(points).splitlines()[0]) and "with queries" in table
