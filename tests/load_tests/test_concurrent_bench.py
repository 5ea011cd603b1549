"""`bench concurrent` on a tiny burst with the real model and the real native service (a subprocess):
every prompt is served, the JSON and the table carry each seed's row, the ratio needs both engines,
and a bad engine list is a CLI error. No timing thresholds."""

from __future__ import annotations

import argparse
import json
import random

import pytest

from load_tests.concurrent_bench import SPECIAL_MARGIN, add_bench_concurrent_args, random_prompt, run_bench_concurrent


def _args(*argv: str):
    parser = argparse.ArgumentParser()
    add_bench_concurrent_args(parser)
    return parser.parse_args(list(argv))


def test_random_prompts_are_new_per_seed_and_avoid_the_special_tokens():
    first, again, other = (random_prompt(1000, 64, random.Random(k)) for k in ("0-native", "0-native", "1-native"))
    assert first == again != other
    assert len(first) == 64 and all(SPECIAL_MARGIN <= t < 1000 - SPECIAL_MARGIN for t in first + other)


@pytest.mark.slow   # a bench (`bash scripts/test.sh --run-slow`)
def test_a_burst_on_the_native_engine_serves_every_prompt(tmp_path, embedded_model_dir, capsys):
    out = tmp_path / "concurrent.json"
    args = _args("--engine", "native", "--concurrency", "3", "--prompt-tokens", "40", "--seeds", "0,1",
                 "--model", str(embedded_model_dir), "--dtype", "float32", "--json", str(out))
    assert run_bench_concurrent(args) == 0
    result = json.loads(out.read_text())
    assert [(r["engine"], r["seed"]) for r in result["rows"]] == [("native", 0), ("native", 1)]
    assert all(r["prompt_tokens"] == 3 * 40 and r["tokens_per_s"] > 0 for r in result["rows"])
    assert "native_over_vllm" not in result          # a ratio needs both engines
    assert set(result["tokens_per_s"]["native"]) == {"median", "min", "max"}
    assert "| native | 1 |" in capsys.readouterr().out


def test_an_unknown_engine_is_a_cli_error(capsys):
    assert run_bench_concurrent(_args("--engine", "native,tgi")) == 1
    assert "--engine" in capsys.readouterr().err
