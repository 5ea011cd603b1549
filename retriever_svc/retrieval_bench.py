"""`streamrag bench retrieval`: latency and recall of each ANNS stage against exact search.

Queries are sentences taken from randomly sampled passages of the index (seeded); the
ground truth is the exact top-k by brute force over the stored vectors. For each query the
bench times one plain search at the final L (`full_search_ms`: what a retriever without
early results would take) and the staged search the service runs (`stages[i].ms`: time from
the start until stage i's list is ready; `first_emit_ms` is stage 0's). Query embedding is
common to both and left out of them (`query_embed_ms` reports it). Prints a table; `--json`
writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from servicekit.stats import percentile

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# The targets for the early results.
TARGET_FIRST_EMIT_RATIO = 0.25
TARGET_FIRST_OVERLAP = 0.60
TARGET_FINAL_RECALL = 0.95


def derive_queries(texts: Sequence[str], count: int, seed: int = 0) -> list[str]:
    """One prose sentence (6 to 30 words) from each of `count` randomly chosen passages."""
    rng = random.Random(seed)
    queries: list[str] = []
    for i in rng.sample(range(len(texts)), len(texts)):
        sentences = [s for s in SENTENCE_END.split(" ".join(texts[i].split())) if 6 <= len(s.split()) <= 30]
        if sentences:
            queries.append(rng.choice(sentences))
        if len(queries) == count:
            break
    return queries


def percentiles(values_s: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {"p50": round(percentile(ms, 50), 3), "p95": round(percentile(ms, 95), 3)}


def run_bench(index, schedule: Sequence[int], beam_width: int, k: int = 10, queries: int = 200,
              seed: int = 0, warmup: int = 20) -> dict:
    """Measure `index` (an `AnnsIndex`); returns the JSON-ready result."""
    import numpy as np

    from retriever_svc.anns.index import recall
    from retriever_svc.anns.stages import effective_schedule
    from retriever_svc.corpus.embedding import embed

    texts = [p.text for p in index.store.all()]
    questions = derive_queries(texts, queries, seed)
    if not questions:
        raise ValueError("the index has no passage with a sentence to ask about")
    embed_s = []
    for question in questions:           # one at a time, as the service does
        started = time.perf_counter()
        embed([question])
        embed_s.append(time.perf_counter() - started)
    vectors = embed(questions)
    k = min(k, index.size)
    sizes = effective_schedule(schedule, k)
    for vector in vectors[:warmup]:
        index.search(vector, k, sizes[-1], beam_width)
    full_s, full_recall, first_s = [], [], []
    stage_s: list[list[float]] = [[] for _ in sizes]
    stage_recall: list[list[float]] = [[] for _ in sizes]
    stage_overlap: list[list[float]] = [[] for _ in sizes]
    stage_emitted: list[list[float]] = [[] for _ in sizes]
    for vector in vectors:
        exact = index.exact(vector, k)
        started = time.perf_counter()
        rows, _ = index.search(vector, k, sizes[-1], beam_width)
        full_s.append(time.perf_counter() - started)
        full_recall.append(recall(rows, exact))
        stages = list(index.stages(vector, k, sizes, beam_width))
        final = stages[-1].rows
        first_s.append(stages[0].elapsed_s)
        for i, stage in enumerate(stages):
            stage_s[i].append(stage.elapsed_s)
            stage_recall[i].append(recall(stage.rows, exact))
            stage_overlap[i].append(recall(stage.rows, final))
            stage_emitted[i].append(float(stage.changed or stage.final))
    result = {
        "k": k, "queries": len(questions), "passages": index.size, "index": str(index.directory),
        "l_schedule": sizes, "beam_width": beam_width,
        "full_search_ms": percentiles(full_s), "full_search_recall_at_k": round(float(np.mean(full_recall)), 4),
        "first_emit_ms": percentiles(first_s), "query_embed_ms": percentiles(embed_s),
        "stages": [{"L": size, "ms": percentiles(stage_s[i]),
                    "recall_at_k": round(float(np.mean(stage_recall[i])), 4),
                    "overlap_with_final": round(float(np.mean(stage_overlap[i])), 4),
                    "emitted_fraction": round(float(np.mean(stage_emitted[i])), 4)} for i, size in enumerate(sizes)],
    }
    ratio = result["first_emit_ms"]["p50"] / max(result["full_search_ms"]["p50"], 1e-9)
    result["targets"] = {
        "first_emit_over_full_p50": round(ratio, 3), "first_emit_within_25pct": ratio <= TARGET_FIRST_EMIT_RATIO,
        "first_overlap_ge_60pct": result["stages"][0]["overlap_with_final"] >= TARGET_FIRST_OVERLAP,
        "final_recall_ge_95pct": result["stages"][-1]["recall_at_k"] >= TARGET_FINAL_RECALL,
    }
    return result


def format_table(result: dict) -> str:
    lines = [f"{result['queries']} queries, k={result['k']}, {result['passages']} passages, "
             f"beam width {result['beam_width']}",
             f"{'stage':>5} {'L':>5} {'p50 ms':>8} {'p95 ms':>8} {'recall@k':>9} {'overlap':>8} {'emitted':>8}"]
    for i, stage in enumerate(result["stages"]):
        lines.append(f"{i:>5} {stage['L']:>5} {stage['ms']['p50']:>8.2f} {stage['ms']['p95']:>8.2f} "
                     f"{stage['recall_at_k']:>9.3f} {stage['overlap_with_final']:>8.3f} "
                     f"{stage['emitted_fraction']:>8.2f}")
    full, first, targets = result["full_search_ms"], result["first_emit_ms"], result["targets"]
    lines.append(f"full search at L={result['l_schedule'][-1]}: p50 {full['p50']:.2f} ms, p95 {full['p95']:.2f} ms, "
                 f"recall@k {result['full_search_recall_at_k']:.3f}")
    lines.append(f"first emit: p50 {first['p50']:.2f} ms, p95 {first['p95']:.2f} ms "
                 f"({targets['first_emit_over_full_p50']:.0%} of the full search); "
                 f"query embedding (not included): p50 {result['query_embed_ms']['p50']:.2f} ms")
    lines.append("targets: " + ", ".join(f"{name} {'ok' if ok else 'MISSED'}" for name, ok in targets.items()
                                         if isinstance(ok, bool)))
    return "\n".join(lines)


def add_bench_retrieval_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag bench retrieval`."""
    parser.add_argument("--index", type=Path, default=None, help="index directory (default: the cache's)")
    parser.add_argument("--queries", type=int, default=200, help="number of queries")
    parser.add_argument("--k", type=int, default=10, help="top-k")
    parser.add_argument("--l-schedule", default=None, help="search list sizes (default: the retriever's)")
    parser.add_argument("--beam-width", type=int, default=None, help="beam width (default: the retriever's)")
    parser.add_argument("--seed", type=int, default=0, help="query sampling seed")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def run_bench_retrieval(args: argparse.Namespace) -> int:
    from retriever_svc.anns.backend import DEFAULT_BEAM_WIDTH, DEFAULT_SCHEDULE, parse_beam_width, parse_schedule
    from retriever_svc.anns.index import AnnsIndex
    from retriever_svc.corpus.index import default_index_dir

    try:
        schedule = parse_schedule(args.l_schedule) if args.l_schedule else DEFAULT_SCHEDULE
        width = parse_beam_width(args.beam_width) if args.beam_width is not None else DEFAULT_BEAM_WIDTH
        index = AnnsIndex(args.index or default_index_dir())
        result = run_bench(index, schedule, width, k=args.k, queries=args.queries, seed=args.seed)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
