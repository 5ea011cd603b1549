"""`streamrag bench retrieval`: ANNS search with early results, stage by stage or backend by backend.

**One index, stage by stage** (without `--backend`): latency and recall of each ANNS stage
against exact search. Queries are sentences taken from randomly sampled passages of the index
(seeded); the ground truth is the exact top-k by brute force over the stored vectors. For each
query the bench times one plain search at the final L (`full_search_ms`: what a retriever
without early results would take) and the staged search the service runs (`stages[i].ms`:
time from the start until stage i's list is ready; `first_emit_ms` is stage 0's). Query
embedding is common to both and left out of them (`query_embed_ms` reports it). Prints a
table; `--json` writes the numbers.

**The backends side by side** (`--backend diskannpy,milvus --json OUT`): on the default index
(the Python docs) and the same queries, for each backend (diskannpy in this process; Milvus at
`--milvus-uri`, or an embedded server this bench starts and stops), one run per seed of `--seeds`
(default 0,1,2), each one:

- `recall_at_10`: the staged search's final top-10 against exact search (brute force over the
  stored vectors), over `--queries` sentences drawn from the passages (the seed picks them);
- `first_emit_fraction`: the first stage's time (p50) over one plain search at the final L
  (p50), as `streamrag bench retrieval` without `--backend` reports it;
- latency p50/p99 and QPS of the whole staged search (what a Retrieve waits for, query
  embedding left out) at 1, 2 and 4 concurrent clients;
- `hit_at_5`: on `load_tests/quality_questions.jsonl`, the share of questions whose final
  top-5 holds a page that answers it (`load_tests.quality.answers`, the rule `bench quality`
  applies to the Ask's documents; here the retriever's own top-5, no stack).

Rows give the median over seeds and its [min, max] spread.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from load_tests.runner import add_seeds_arg, spread, write_json
from servicekit.stats import percentile

BACKENDS = ("diskannpy", "milvus")
DEFAULT_QUESTIONS = Path(__file__).with_name("quality_questions.jsonl")
CONCURRENCY = (1, 2, 4)
TARGET_RECALL_GAP = 0.02          # Milvus within 2% of diskannpy's recall@10 and hit@5
TARGET_FIRST_EMIT_FRACTION = 0.25   # the first stage within 25% of a plain search's time (both benches)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# The stage bench's other targets for the early results.
TARGET_FIRST_OVERLAP = 0.60
TARGET_FINAL_RECALL = 0.95


def add_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag bench retrieval`."""
    parser.add_argument("--index", type=Path, default=None, help="index directory (default: the cache's)")
    parser.add_argument("--queries", type=int, default=200, help="number of queries")
    parser.add_argument("--k", type=int, default=10, help="top-k")
    parser.add_argument("--l-schedule", default=None, help="search list sizes (default: the retriever's)")
    parser.add_argument("--beam-width", type=int, default=None, help="beam width (default: the retriever's)")
    parser.add_argument("--seed", type=int, default=0, help="query sampling seed")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--backend", default=None,
                        help="compare these ANNS backends (comma-separated: diskannpy,milvus) instead of the stage "
                             "bench of one index")
    parser.add_argument("--milvus-uri", default="", help="Milvus to use (default: start an embedded server)")
    parser.add_argument("--milvus-index", choices=["auto", "DISKANN", "HNSW"], default="auto")
    parser.add_argument("--milvus-data", type=Path, default=None,
                        help="the embedded server's data folder (default: a temporary one)")
    add_seeds_arg(parser, what="seeds: each draws its own queries")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="quality questions for hit@5")


def run(args: argparse.Namespace) -> int:
    if args.backend is None:
        measure, table = stage_bench, format_table
    else:
        backends = [name.strip() for name in args.backend.split(",") if name.strip()]
        unknown = sorted(set(backends) - set(BACKENDS))
        if not backends or unknown:
            print(f"error: --backend takes {', '.join(BACKENDS)} (comma-separated), got {args.backend!r}",
                  file=sys.stderr)
            return 1
        if args.queries < 1:
            print("error: --queries must be at least 1", file=sys.stderr)
            return 1
        measure, table = (lambda args: compare(args, backends)), format_rows
    try:
        result = measure(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(table(result))
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


# ---------------------------------------------------------------- one index, stage by stage

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
    from retriever_svc.corpus.embedding import embed
    from retriever_svc.stages import effective_schedule

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
        "first_emit_over_full_p50": round(ratio, 3), "first_emit_within_25pct": ratio <= TARGET_FIRST_EMIT_FRACTION,
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


def stage_bench(args: argparse.Namespace) -> dict:
    """The stage bench of one index (no `--backend`)."""
    from retriever_svc.anns.backend import DEFAULT_BEAM_WIDTH, DEFAULT_SCHEDULE, parse_beam_width, parse_schedule
    from retriever_svc.anns.index import AnnsIndex
    from retriever_svc.corpus.index import default_index_dir

    schedule = parse_schedule(args.l_schedule) if args.l_schedule else DEFAULT_SCHEDULE
    width = parse_beam_width(args.beam_width) if args.beam_width is not None else DEFAULT_BEAM_WIDTH
    index = AnnsIndex(args.index or default_index_dir())
    return run_bench(index, schedule, width, k=args.k, queries=args.queries, seed=args.seed)


# ---------------------------------------------------------------- measuring one backend

def timed_stages(index, vector, k: int, schedule: Sequence[int]):
    """(stages, seconds to the final one)."""
    started = time.perf_counter()
    stages = list(index.stages(vector, k, schedule, index.beam_width))
    return stages, time.perf_counter() - started


def under_load(search: Callable[[object], None], vectors: Sequence, clients: int) -> dict:
    """Every vector searched once by `clients` threads sharing the list: latency p50/p99 (ms) and QPS."""
    latencies: list[float] = []
    lock = threading.Lock()
    position = iter(range(len(vectors)))

    def client() -> None:
        while True:
            with lock:
                i = next(position, None)
            if i is None:
                return
            started = time.perf_counter()
            search(vectors[i])
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    ms = [v * 1000 for v in latencies]
    return {"clients": clients, "p50_ms": round(percentile(ms, 50), 3), "p99_ms": round(percentile(ms, 99), 3),
            "qps": round(len(ms) / wall, 1)}


def measure(index, vectors, question_vectors, questions, k: int, schedule: Sequence[int]) -> dict:
    from load_tests.quality import answers
    from retriever_svc.anns.index import recall

    first, full, recalls = [], [], []
    for vector in vectors[:20]:                     # warm-up: caches, connections
        timed_stages(index, vector, k, schedule)
    for vector in vectors:
        exact = index.exact(vector, k)
        started = time.perf_counter()
        index.search(vector, k, schedule[-1], index.beam_width)
        full.append(time.perf_counter() - started)
        stages, _ = timed_stages(index, vector, k, schedule)
        first.append(stages[0].elapsed_s)
        recalls.append(recall(stages[-1].rows, exact))
    hits = 0
    for question, vector in zip(questions, question_vectors, strict=True):
        stages, _ = timed_stages(index, vector, 5, schedule)
        found = index.passages(stages[-1].rows)
        hits += any(answers(found[row].url, question.pages) for row in stages[-1].rows if row in found)
    load = [under_load(lambda v: timed_stages(index, v, k, schedule), vectors, clients) for clients in CONCURRENCY]
    return {"recall_at_10": statistics.fmean(recalls),
            "first_emit_fraction": percentile(first, 50) / max(percentile(full, 50), 1e-9),
            "first_emit_ms": percentile(first, 50) * 1000, "full_search_ms": percentile(full, 50) * 1000,
            "hit_at_5": hits / len(questions), "concurrency": load}


# ---------------------------------------------------------------- the comparison

def open_index(name: str, directory: Path, args: argparse.Namespace, stack: list[Callable[[], None]]):
    from retriever_svc.anns.index import AnnsIndex

    if name == "diskannpy":
        return AnnsIndex(directory), "diskannpy"
    from retriever_svc.milvus.bundled import MilvusBundledIndex
    from retriever_svc.milvus.connection import MilvusConnection, MilvusSettings

    uri = args.milvus_uri
    if not uri:
        from retriever_svc.milvus.embedded import EmbeddedMilvus

        data = args.milvus_data
        if data is None:                        # a temporary folder goes once the server has stopped
            data = Path(tempfile.mkdtemp(prefix="streamrag-bench-milvus-"))
            stack.append(lambda: shutil.rmtree(data, ignore_errors=True))
        server = EmbeddedMilvus(data, 19630).start()
        stack.append(server.stop)
        uri = server.uri
    connection = MilvusConnection(MilvusSettings(uri, args.milvus_index, timeout_s=30.0)).connect()
    stack.append(connection.close)
    started = time.perf_counter()
    index = MilvusBundledIndex(directory, connection, lambda line: print(f"  milvus: {line}", flush=True))
    print(f"  milvus: ready in {time.perf_counter() - started:.1f} s", flush=True)
    return index, f"milvus ({connection.index_type}, {connection.server_version})"


def summarize(runs: list[dict]) -> dict:
    row = {key: spread([r[key] for r in runs], 4) for key in
           ("recall_at_10", "first_emit_fraction", "first_emit_ms", "full_search_ms", "hit_at_5")}
    row["concurrency"] = [{"clients": clients,
                           **{key: spread([r["concurrency"][i][key] for r in runs], 3) for key in ("p50_ms", "p99_ms",
                                                                                                    "qps")}}
                          for i, clients in enumerate(CONCURRENCY)]
    return row


def compare(args: argparse.Namespace, backends: list[str]) -> dict:
    from load_tests.quality import load_questions
    from retriever_svc.anns.backend import DEFAULT_BEAM_WIDTH, DEFAULT_SCHEDULE, parse_beam_width, parse_schedule
    from retriever_svc.anns.index import AnnsIndex
    from retriever_svc.corpus.embedding import embed
    from retriever_svc.corpus.index import default_index_dir
    from retriever_svc.stages import effective_schedule

    schedule = parse_schedule(args.l_schedule) if args.l_schedule else DEFAULT_SCHEDULE
    width = parse_beam_width(args.beam_width) if args.beam_width is not None else DEFAULT_BEAM_WIDTH
    directory = args.index or default_index_dir()
    local = AnnsIndex(directory)
    texts = [p.text for p in local.store.all()]
    questions = load_questions(args.questions)
    question_vectors = embed([q.question for q in questions])
    query_vectors = {seed: embed(derive_queries(texts, args.queries, seed)) for seed in args.seeds}
    k = min(args.k, local.size)
    sizes = effective_schedule(schedule, k)
    rows = []
    cleanup: list[Callable[[], None]] = []
    try:
        for name in backends:
            print(f"{name}: opening", flush=True)
            index, label = open_index(name, directory, args, cleanup)
            index.beam_width = width
            runs = []
            for seed in args.seeds:
                run = measure(index, query_vectors[seed], question_vectors, questions, k, sizes)
                runs.append({"seed": seed, **run})
                print(f"{name}: seed {seed} ({len(runs)}/{len(args.seeds)}): recall@{k} {run['recall_at_10']:.3f}, "
                      f"hit@5 {run['hit_at_5']:.3f}, first emit {run['first_emit_fraction']:.0%}", flush=True)
            rows.append({"backend": name, "index": label, **summarize(runs), "runs": runs})
    finally:
        for close in reversed(cleanup):
            close()
    return {"command": "streamrag bench retrieval --backend " + ",".join(backends), "k": k,
            "queries_per_run": args.queries, "seeds": args.seeds, "quality_questions": len(questions),
            "passages": local.size, "l_schedule": sizes, "beam_width": width, "concurrency": list(CONCURRENCY),
            "backends": rows, "targets": targets(rows)}


def targets(rows: list[dict]) -> dict:
    by_name = {row["backend"]: row for row in rows}
    result = {}
    if "milvus" in by_name:
        milvus = by_name["milvus"]
        result["milvus_first_emit_within_25pct"] = milvus["first_emit_fraction"]["median"] <= TARGET_FIRST_EMIT_FRACTION
        if "diskannpy" in by_name:
            disk = by_name["diskannpy"]
            for key in ("recall_at_10", "hit_at_5"):
                gap = disk[key]["median"] - milvus[key]["median"]
                result[f"milvus_{key}_within_2pct"] = gap <= TARGET_RECALL_GAP
    return result


def format_rows(result: dict) -> str:
    lines = [f"{result['passages']} passages, k={result['k']}, L={result['l_schedule']}, "
             f"{result['queries_per_run']} queries x {len(result['seeds'])} seeds (median [min, max])",
             f"{'backend':<10} {'recall@10':>18} {'hit@5':>18} {'first emit':>18}   latency p50/p99 ms, QPS at "
             + ", ".join(map(str, result["concurrency"])) + " clients"]

    def cell(stat: dict, pct: bool = False) -> str:
        f = (lambda v: f"{v:.0%}") if pct else (lambda v: f"{v:.3f}")
        return f"{f(stat['median'])} [{f(stat['min'])},{f(stat['max'])}]"

    for row in result["backends"]:
        load = "; ".join(f"{c['p50_ms']['median']:.1f}/{c['p99_ms']['median']:.1f}, {c['qps']['median']:.0f}"
                         for c in row["concurrency"])
        lines.append(f"{row['backend']:<10} {cell(row['recall_at_10']):>18} {cell(row['hit_at_5']):>18} "
                     f"{cell(row['first_emit_fraction'], True):>18}   {load}")
    if result["targets"]:
        lines.append("targets: " + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in result["targets"].items()))
    return "\n".join(lines)
