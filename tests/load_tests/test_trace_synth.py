"""The trace synthesizer: calibrated shapes, determinism, scaling, and valid trace files."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
from pathlib import Path

import pytest

from load_tests.synth.models import MODELS
from load_tests.synth.passage_pool import PassagePool
from load_tests.synth.published import PUBLISHED
from load_tests.synth.synthesize import SynthParams, anns_stage_lists, synthesize
from load_tests.synth.tokens import ApproxTokenCounter, DocTokens
from load_tests.synth.trace_stats import measure_query, measure_trace, statistics_table, trace_statistics
from load_tests.trace_synth import add_trace_synth_args, run_trace_synth
from retriever_svc.corpus.passages import Passage
from retriever_svc.corpus.store import write_store
from retriever_svc.replay.trace import read_trace

SENTENCES = [
    "The open function returns a file object that reads or writes text in the chosen encoding.",
    "A list comprehension builds a new list by applying an expression to each item of an iterable.",
    "Dictionaries map hashable keys to values and keep the order in which the keys were inserted.",
    "The with statement calls the context manager's exit method even when the block raises.",
    "Generators produce values lazily, suspending their frame at each yield until asked again.",
    "The pathlib module offers classes for filesystem paths with methods for common operations.",
]


def tiny_passages(pages: int = 6, per_page: int = 8) -> list[Passage]:
    out = []
    for p in range(pages):
        for i in range(per_page):
            text = " ".join(SENTENCES[(p + i + j) % len(SENTENCES)] for j in range(4))
            out.append(Passage(f"page{p}.html:{i}", f"Page {p} — Section {i}", f"page{p}.html#s{i}",
                               f"Section {i}\n\n{text}"))
    return out


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "passages.sqlite"
    write_store(path, tiny_passages(), {"corpus": "tiny"})
    return path


@pytest.fixture(scope="module")
def pool() -> PassagePool:
    return PassagePool(tiny_passages(), ApproxTokenCounter())


def params(workload: str, **kw) -> SynthParams:
    return SynthParams(workload, **{"queries": 40, "token_scale": 0.02, **kw})


def statistics(queries) -> dict[str, float]:
    return trace_statistics(queries, measure_trace(queries, DocTokens(ApproxTokenCounter())))


def contexts(query) -> list[list]:
    """The context (list of documents) after each chunk."""
    out, context = [], []
    for chunk in query.chunks:
        context = context + list(chunk.documents) if chunk.mode == "append" else list(chunk.documents)
        out.append(context)
    return out


@pytest.mark.parametrize("workload", ["crawler", "anns"])
def test_same_seed_same_trace_other_seed_other_trace(workload: str, pool: PassagePool) -> None:
    first = synthesize(params(workload, seed=7), pool)
    assert synthesize(params(workload, seed=7), pool) == first
    assert synthesize(params(workload, seed=8), pool) != first


def test_crawler_chunk_counts_are_unimodal_around_6_to_10(pool: PassagePool) -> None:
    counts = [len(q.chunks) for q in synthesize(params("crawler", queries=100), pool)]
    assert min(counts) >= 2 and max(counts) <= 20
    assert sum(6 <= n <= 10 for n in counts) / len(counts) >= 0.6


def test_anns_chunk_counts_are_right_skewed_mostly_1_to_3(pool: PassagePool) -> None:
    counts = [len(q.chunks) for q in synthesize(params("anns", queries=100), pool)]
    assert min(counts) == 1 and max(counts) <= 16
    assert sum(n <= 3 for n in counts) / len(counts) > 0.5
    assert max(counts) >= 6                              # a tail of longer refinements


def test_crawler_chunks_append_new_documents_so_the_context_grows(pool: PassagePool) -> None:
    for query in synthesize(params("crawler"), pool):
        assert all(c.mode == "append" and len(c.documents) == 1 for c in query.chunks)
        sizes = [len(c) for c in contexts(query)]
        assert sizes == list(range(1, len(query.chunks) + 1))
        ids = [d.id for c in query.chunks for d in c.documents]
        assert len(set(ids)) == len(ids)
        assert [c.final for c in query.chunks] == [False] * (len(query.chunks) - 1) + [True]
        assert measure_query(query, DocTokens(ApproxTokenCounter())).invalidated == 0


def test_anns_updates_carry_full_lists_and_replace_documents_before_the_tail(pool: PassagePool) -> None:
    queries = synthesize(params("anns", queries=60, top_k=10), pool)
    first_changes = []
    for query in queries:
        assert all(c.mode == "update" and len(c.documents) == 10 for c in query.chunks)
        assert [c.stage.index for c in query.chunks] == list(range(len(query.chunks)))
        assert query.chunks[-1].stage.recall_at_k == 1.0
        lists = [[d.id for d in c.documents] for c in query.chunks]
        for old, new in itertools.pairwise(lists):
            assert old != new                            # every update changes the list
            first_changes.append(next(i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b))
        if len(lists) > 1:
            assert measure_query(query, DocTokens(ApproxTokenCounter())).invalidated > 0
    assert first_changes and min(first_changes) == 0     # the front of the list gets replaced too
    assert sum(j < 5 for j in first_changes) >= 0.2 * len(first_changes)
    # the same document id always carries the same text across a query's updates
    for query in queries:
        texts: dict[str, str] = {}
        for chunk in query.chunks:
            for doc in chunk.documents:
                assert texts.setdefault(doc.id, doc.text) == doc.text


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_anns_stage_lists_end_at_the_true_top_k_and_always_change(k: int) -> None:
    for seed in range(20):
        lists, impostors = anns_stage_lists(random.Random(seed), k, 16)
        assert len(lists) == 16 and lists[-1] == list(range(k))
        assert all(len(labels) == k for labels in lists)
        assert all(a != b for a, b in itertools.pairwise(lists))
        assert {label for labels in lists for label in labels} <= set(range(k + impostors))


@pytest.mark.parametrize("workload", ["crawler", "anns"])
def test_time_scale_multiplies_every_time(workload: str, pool: PassagePool) -> None:
    base = synthesize(params(workload, time_scale=1.0), pool)
    slow = synthesize(params(workload, time_scale=3.0), pool)
    for a, b in zip(base, slow, strict=True):
        assert [c.documents for c in a.chunks] == [c.documents for c in b.chunks]
        for ca, cb in zip(a.chunks, b.chunks, strict=True):
            assert cb.t_s == pytest.approx(3 * ca.t_s, abs=5e-6)
    gaps = statistics(base)["gap_median_ms"]
    assert statistics(slow)["gap_median_ms"] == pytest.approx(3 * gaps, rel=1e-3)


@pytest.mark.parametrize("workload", ["crawler", "anns"])
def test_token_scale_shrinks_documents_and_the_cap_bounds_them(workload: str, pool: PassagePool) -> None:
    tokens = DocTokens(ApproxTokenCounter())
    small = [measure_query(q, tokens).tokens for q in synthesize(params(workload, token_scale=0.02), pool)]
    large = [measure_query(q, tokens).tokens for q in synthesize(params(workload, token_scale=0.08), pool)]
    assert all(s <= g for s, g in zip(small, large, strict=True))
    assert sum(large) > 3 * sum(small)
    capped = synthesize(params(workload, token_scale=0.05, max_prompt_tokens=150), pool)
    assert max(measure_query(q, tokens).tokens for q in capped) <= 150
    assert any(q.meta["capped"] for q in capped)


def run_cli(tmp_path: Path, store: Path, *extra: str) -> tuple[int, Path]:
    parser = argparse.ArgumentParser()
    add_trace_synth_args(parser)
    out = tmp_path / "trace.jsonl"
    args = parser.parse_args(["--out", str(out), "--passages", str(store), "--tokenizer", "approx", *extra])
    return run_trace_synth(args), out


@pytest.mark.parametrize("workload", ["crawler", "anns"])
def test_cli_writes_a_valid_trace_with_header_and_prints_published_beside_synthesized(
        workload: str, store_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(tmp_path, store_path, "--workload", workload, "--queries", "30", "--token-scale", "0.02",
                        "--time-scale", "0.5", "--seed", "3")
    assert code == 0
    trace = read_trace(out)                              # validates every line
    assert len(trace.queries) == 30 and all(q.source == "synthesized" for q in trace.queries)
    header = trace.header
    assert header.generator == "streamrag trace synth" and header.time_scale == 0.5
    assert header.meta["workload"] == workload and header.meta["seed"] == 3
    targets = header.meta["calibration"]["targets"]
    assert targets["tokens_mean"] == pytest.approx(PUBLISHED[workload]["tokens_per_query"]["mean"] * 0.02)
    assert targets["retrieval_mean_s"] == pytest.approx(PUBLISHED[workload]["retrieval_latency_s"]["mean"] * 0.5)
    assert all(q.meta["tokens"] > 0 for q in trace.queries)
    printed = capsys.readouterr().out
    pub = PUBLISHED[workload]
    for number in (*pub["tokens_per_query"].values(), pub["inter_chunk_arrival_ms"]["median"],
                   pub["retrieval_latency_s"]["mean"]):
        assert str(number) in printed
    assert "published" in printed and "synthesized" in printed
    (tmp_path / "again").mkdir()
    code, again = run_cli(tmp_path / "again", store_path, "--workload", workload, "--queries", "30",
                          "--token-scale", "0.02", "--time-scale", "0.5", "--seed", "3")
    assert code == 0 and read_trace(again).queries == trace.queries


def test_cli_measures_each_query_once(store_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import load_tests.synth.trace_stats as trace_stats

    measured: list[str] = []
    original = trace_stats.measure_query

    def counting(query, tokens):
        measured.append(query.query_id)
        return original(query, tokens)

    monkeypatch.setattr(trace_stats, "measure_query", counting)
    code, out = run_cli(tmp_path, store_path, "--workload", "anns", "--queries", "12", "--token-scale", "0.02")
    assert code == 0
    assert sorted(measured) == sorted(q.query_id for q in read_trace(out).queries)      # each once


def test_cli_reports_a_missing_store(tmp_path: Path) -> None:
    code, out = run_cli(tmp_path, tmp_path / "absent.sqlite", "--workload", "crawler")
    assert code == 2 and not out.exists()


def test_statistics_meet_the_scaled_targets_on_a_larger_sample(pool: PassagePool) -> None:
    for workload in ("crawler", "anns"):
        queries = synthesize(SynthParams(workload, queries=300, token_scale=0.05, time_scale=1.0), pool)
        stats = statistics(queries)
        pub = PUBLISHED[workload]
        for key in ("mean", "p50", "p95"):
            assert stats[f"tokens_{key}"] == pytest.approx(pub["tokens_per_query"][key] * 0.05, rel=0.1), key
        assert stats["gap_median_ms"] == pytest.approx(pub["inter_chunk_arrival_ms"]["median"], rel=0.05)
        assert stats["retrieval_mean_s"] == pytest.approx(pub["retrieval_latency_s"]["mean"], rel=0.01)
        table = statistics_table(workload, stats, 0.05, 1.0)
        assert table.splitlines()[0].split()[:2] == ["metric", "published"]


def test_published_figures_match_the_shared_calibration_file() -> None:
    candidates = [Path(__file__).resolve().parents[2] / "shared", Path("/work/shared")]
    found = [p / "workloads" / "stream2llm_published_stats.json" for p in candidates]
    found = [p for p in found if p.is_file()]
    if not found:
        pytest.skip("shared/workloads/stream2llm_published_stats.json is not here")
    shared = json.loads(found[0].read_text())["workloads"]
    for ours, theirs in (("crawler", "crawler_append"), ("anns", "anns_update")):
        for key, value in PUBLISHED[ours].items():
            assert shared[theirs][key] == value, (ours, key)


@pytest.mark.parametrize("workload", ["crawler", "anns"])
def test_workload_models_aim_at_the_published_figures(workload: str) -> None:
    model, pub = MODELS[workload], PUBLISHED[workload]
    assert model.tokens == tuple(pub["tokens_per_query"][key] for key in ("mean", "p50", "p95"))
    assert model.retrieval_mean_s == pub["retrieval_latency_s"]["mean"]
    assert model.gap_median_s * 1000 == pytest.approx(pub["inter_chunk_arrival_ms"]["median"])


def test_embedded_tokenizer_cuts_at_token_boundaries_and_the_approximation_tracks_it() -> None:
    from inference_svc.embedded_model import embedded_model_dir

    if not (embedded_model_dir() / "tokenizer.json").is_file():
        pytest.skip("the embedded model is not prepared")
    pytest.importorskip("transformers")
    from load_tests.synth.tokens import EmbeddedTokenCounter

    counter = EmbeddedTokenCounter.load()
    text = "\n\n".join(p.text for p in tiny_passages()[:6])
    total = counter.count(text)
    assert counter.count(counter.cut(text, 50)) <= 50 < total
    assert counter.cut(text, total + 10) == text
    assert math.isclose(ApproxTokenCounter().count(text), total, rel_tol=0.2)
