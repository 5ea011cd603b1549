"""`streamrag bench blend`'s pure parts: the Zipf-skewed requests (passages reordered every time)
and the summary's top-level keys at the default share."""

from __future__ import annotations

import argparse
import random
from collections import Counter

from load_tests.blend_bench import FRACTIONS, make_requests, slowest, summarize, zipf_draws
from retriever_svc.replay.trace import TraceChunk, TraceQuery

QUESTIONS = [{"id": f"q{i}", "question": f"question {i}?", "pages": [f"p{i}.html"]} for i in range(10)]
OWN = {q["id"]: [(f"{q['id']}:{n}", f"text {q['id']} {n}") for n in range(3)] for q in QUESTIONS}
POOL = [(f"pop:{n}", f"popular {n}") for n in range(8)]


def test_zipf_draws_favour_the_first_items():
    counts = Counter(zipf_draws(10, 2000, 1.1, random.Random(0)))
    assert counts[0] > counts[4] > counts[9] > 0


def test_requests_repeat_questions_in_new_orders():
    requests = make_requests(0, 40, 1.1, OWN, POOL, QUESTIONS, shared=2)
    assert len(requests) == 40
    by_question: dict[str, list] = {}
    for question, docs in requests:
        assert len(docs) == 5 and len(set(docs)) == 5
        by_question.setdefault(question, []).append([pid for pid, _ in docs])
    repeated = [orders for orders in by_question.values() if len(orders) > 1]
    assert repeated, "a Zipf skew repeats questions"
    assert any(len({tuple(o) for o in orders}) > 1 for orders in repeated), "passages come in new orders"
    assert make_requests(0, 40, 1.1, OWN, POOL, QUESTIONS, 2) == requests       # seeded


def test_summary_keys_at_the_default_share():
    args = argparse.Namespace(fractions=list(FRACTIONS), seeds=[0, 1], requests=4, zipf=1.1, max_tokens=32,
                              dtype="float32", token_budget=2048, trace=None, qps=0.333, max_queries=None)

    def run(seed, speed):
        return {"seed": seed, "sweep": [{"fraction": f, "ttft_speedup": speed / (1 + f), "ttft_p50_speedup": 1.0,
                                         "answer_agreement": 1 - f / 10 if f else 0.5, "hit_rate": 0.6,
                                         "recompute_fraction": f, "reused_share_of_prompt": 0.5}
                                        for f in FRACTIONS]}

    runs = {"blend-s": {"tokens_computed": 1000, "blend_reused_tokens": 250}}
    anns = [{"seed": s, "p95_speedup_exact": 1.2, "p95_speedup_blend": 1.5 + s, "runs": runs} for s in (0, 1, 2)]
    summary = summarize(args, [run(0, 2.0), run(1, 3.0), run(2, 4.0)], anns)
    assert summary["cross_request_ttft_speedup"] == round(3.0 / 1.15, 3)
    assert summary["answer_agreement"] == round(1 - 0.015, 3)
    assert summary["recompute_fraction"] == 0.15 and summary["hit_rate"] == 0.6
    assert summary["anns_p95_speedup_exact"] == 1.2 and summary["anns_p95_speedup_blend"] == 2.5
    assert [s["fraction"] for s in summary["sweep"]] == list(FRACTIONS)
    assert summary["anns"]["blend_reused_share"]["median"] == 0.25


def test_slowest_blend_requests_show_their_refinement_window():
    def query(qid, times):
        return TraceQuery(qid, "q?", "anns", "synthesized",
                          tuple(TraceChunk(t_s=t, mode="update", documents=(), final=i == len(times) - 1)
                                for i, t in enumerate(times)))

    queries = [query("once", [2.0]), query("refined", [1.0, 1.5, 3.25])]
    rows = [{"mode": "blend", "streaming": True, "query_id": "once", "ttft_s": 0.9, "prompt_tokens": 800,
             "blend_reused_tokens": 0},
            {"mode": "blend", "streaming": True, "query_id": "refined", "ttft_s": 0.2, "prompt_tokens": 500,
             "blend_reused_tokens": 300},
            {"mode": "exact", "streaming": True, "query_id": "once", "ttft_s": 5.0, "prompt_tokens": 800,
             "blend_reused_tokens": 0}]
    got = slowest(rows, queries, n=2)
    assert [(r["query"], r["refine_window_s"], r["blend_reused_tokens"]) for r in got] == [
        ("once", 0.0, 0), ("refined", 2.25, 300)]
