"""Per request, which queries streaming made slower (load_tests/per_request.py)."""

from __future__ import annotations

import argparse
import json

from load_tests.per_request import add_bench_per_request_args, load_rows, pairs, run_bench_per_request


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_bench_per_request_args(parser)
    return run_bench_per_request(parser.parse_args(argv))


def row(query: str, streaming: bool, ttft: float | None, qps: float = 0.333, error: str | None = None) -> dict:
    return {"engine": "native", "workload": "anns", "policy": "fcfs", "eviction": "cost", "qps": qps,
            "query_id": query, "streaming": streaming, "ttft_s": ttft, "chunks": 3, "prompt_tokens": 500,
            "error": error}


def write_run(directory, rows) -> None:
    directory.mkdir()
    (directory / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rows_pair_by_query_and_configuration_and_failures_are_left_out(tmp_path):
    write_run(tmp_path / "run", [
        row("q1", True, 0.5), row("q1", False, 1.0),          # faster streamed
        row("q2", True, 1.3), row("q2", False, 1.0),          # slower by 0.3 s
        row("q3", True, 1.02), row("q3", False, 1.0),         # slower, within the margin
        row("q4", True, None, error="DEADLINE_EXCEEDED"), row("q4", False, 1.0),
        row("q1", True, 2.0, qps=0.667), row("q1", False, 1.0, qps=0.667),   # another configuration
    ])
    matched = pairs(load_rows(tmp_path / "run"))
    assert sorted(p.query_id for p in matched[("native", "anns", "fcfs", "cost", 0.333)]) == ["q1", "q2", "q3"]
    assert [p.loss_s for p in matched[("native", "anns", "fcfs", "cost", 0.667)]] == [1.0]


def test_the_command_counts_slower_requests_and_refuses_a_missing_run(tmp_path, capsys):
    write_run(tmp_path / "seed-0", [row("q1", True, 0.5), row("q1", False, 1.0),
                                    row("q2", True, 1.3), row("q2", False, 1.0),
                                    row("q3", True, 1.02), row("q3", False, 1.0)])
    assert main([str(tmp_path / "seed-0"), "--margin", "0.05", "--worst", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 3 | 2 | 1 | q2: 1.30 / 1.00, 3, 500 |" in out
    assert main([str(tmp_path / "nope")]) == 2
    assert "no requests.jsonl" in capsys.readouterr().err
