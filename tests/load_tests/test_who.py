"""`streamrag bench who`: the steps between a request's last chunk and its first token, by request."""

from __future__ import annotations

import argparse
import json

from load_tests.who import add_bench_who_args, run_bench_who


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_bench_who_args(parser)
    return run_bench_who(parser.parse_args(argv))

START = 1_000.0      # the run's zero in wall time


def write_run(tmp_path, engine: str) -> None:
    rows = [{"query_id": "anns-00001", "engine": engine, "policy": "fcfs", "streaming": True, "arrival_s": 0.0,
             "last_chunk_s": 1.0, "first_token_s": 3.0, "ttft_s": 2.0, "prompt_tokens": 300, "chunks": 2},
            {"query_id": "anns-00002", "engine": engine, "policy": "fcfs", "streaming": True, "arrival_s": 0.5,
             "last_chunk_s": 0.6, "first_token_s": 2.0, "ttft_s": 1.4, "prompt_tokens": 200, "chunks": 1}]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"configs": [
        {"engine": engine, "policy": "fcfs", "streaming": True, "start_wall_s": START}]}))


def test_the_window_names_whose_work_ran_while_a_request_waited(tmp_path, capsys):
    write_run(tmp_path, "native")
    steps = [
        {"t": START + 0.2, "scheduled": {"x-s-anns-00001": 64}, "complete": []},                 # before: not shown
        {"t": START + 1.1, "scheduled": {"x-s-anns-00002": 200, "x-s-anns-00001": 16}, "complete": ["x-s-anns-00002"]},
        {"t": START + 2.1, "scheduled": {"x-s-anns-00001": 220}, "complete": ["x-s-anns-00001"]},
        {"t": START + 3.5, "scheduled": {"x-s-anns-00003": 50}, "complete": []},                 # after: not shown
    ]
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps(s) + "\n" for s in steps))
    main([str(tmp_path), str(log), "--engine", "native", "--ids", "anns-00001"])
    out = capsys.readouterr().out
    assert "anns-00001: 300 tokens, 2 chunks, TTFT 2.00 s; 2 steps" in out
    assert "anns-00002c:200 anns-00001*:16" in out
    assert "tokens in the window: anns-00001 236, anns-00002 200 (total 436)" in out


def test_another_engines_rows_are_not_read(tmp_path, capsys):
    write_run(tmp_path, "vllm")
    log = tmp_path / "steps.jsonl"
    log.write_text(json.dumps({"t": START + 1.1, "scheduled": {"x-s-anns-00001": 16}, "complete": []}) + "\n")
    assert main([str(tmp_path), str(log), "--engine", "native"]) == 2
    assert "no request of the run appears" in capsys.readouterr().err
