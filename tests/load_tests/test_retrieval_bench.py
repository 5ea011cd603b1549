"""`bench retrieval` on the tiny corpus index: the JSON shape, the table, and what the numbers mean."""

from __future__ import annotations

import argparse
import json

import pytest

from load_tests.retrieval_bench import add_args, derive_queries, run
from tests.retriever import build_tiny_index


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory):
    return build_tiny_index(tmp_path_factory.mktemp("bench-tiny"))


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_args(parser)
    return parser.parse_args(list(argv))


def test_derive_queries_takes_prose_sentences_reproducibly():
    texts = ["Heading\n\nShort. This sentence has more than six words in it. Tiny.", "x y", "No sentence here"]
    assert derive_queries(texts, 5, seed=3) == ["This sentence has more than six words in it."]
    assert derive_queries(texts * 4, 3, seed=1) == derive_queries(texts * 4, 3, seed=1)


def test_bench_writes_the_issue_json_and_prints_a_table(tiny_index, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = bench_args("--index", str(tiny_index), "--queries", "4", "--k", "3", "--l-schedule", "1,4,8",
                      "--beam-width", "2", "--json", str(out))
    assert run(args) == 0
    result = json.loads(out.read_text())
    assert result["k"] == 3 and result["queries"] == 4
    for key in ("full_search_ms", "first_emit_ms"):
        assert set(result[key]) == {"p50", "p95"} and 0 < result[key]["p50"] <= result[key]["p95"]
    stages = result["stages"]
    assert [s["L"] for s in stages] == [3, 4, 8] == result["l_schedule"]           # L raised to at least k
    assert result["first_emit_ms"] == stages[0]["ms"]
    assert stages[-1]["overlap_with_final"] == 1.0 and stages[-1]["emitted_fraction"] == 1.0
    assert all(0.0 <= s["recall_at_k"] <= 1.0 and 0.0 <= s["overlap_with_final"] <= 1.0 for s in stages)
    assert [s["ms"]["p50"] for s in stages] == sorted(s["ms"]["p50"] for s in stages)    # cumulative
    assert stages[-1]["recall_at_k"] == 1.0                # five passages: every search is exact
    assert set(result["targets"]) >= {"first_emit_within_25pct", "first_overlap_ge_60pct", "final_recall_ge_95pct"}
    table = capsys.readouterr().out
    assert "recall@k" in table and "first emit" in table and str(out) in table


def test_bench_reports_a_missing_index(tmp_path, capsys):
    assert run(bench_args("--index", str(tmp_path))) == 1
    assert "index build" in capsys.readouterr().err
