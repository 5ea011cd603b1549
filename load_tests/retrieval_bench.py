"""`streamrag bench retrieval --backend diskannpy,milvus --json OUT`: the ANNS backends side by side.

On the default index (the Python docs) and the same queries, for each backend (diskannpy in
this process; Milvus at `--milvus-uri`, or an embedded server this bench starts and stops),
`--runs` runs (seeds 0, 1, ...), each one:

- `recall_at_10`: the staged search's final top-10 against exact search (brute force over the
  stored vectors), over `--queries` sentences drawn from the passages (the seed picks them);
- `first_emit_fraction`: the first stage's time (p50) over one plain search at the final L
  (p50), as `streamrag bench retrieval` without `--backend` reports it;
- latency p50/p99 and QPS of the whole staged search (what a Retrieve waits for, query
  embedding left out) at 1, 2 and 4 concurrent clients;
- `hit_at_5`: on `load_tests/quality_questions.jsonl`, the share of questions whose final
  top-5 holds a page that answers it (`load_tests.quality.answers`, the rule `bench quality`
  applies to the Ask's documents; here the retriever's own top-5, no stack).

Rows give the median over runs and its [min, max] spread. Without `--backend` this is the
single-index stage bench (`retriever_svc.retrieval_bench`).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from load_tests.runner import write_json
from servicekit.stats import percentile

BACKENDS = ("diskannpy", "milvus")
DEFAULT_QUESTIONS = Path(__file__).with_name("quality_questions.jsonl")
CONCURRENCY = (1, 2, 4)
TARGET_RECALL_GAP = 0.02          # Milvus within 2% of diskannpy's recall@10 and hit@5
TARGET_FIRST_EMIT_FRACTION = 0.25


def add_args(parser: argparse.ArgumentParser) -> None:
    from retriever_svc.retrieval_bench import add_bench_retrieval_args

    add_bench_retrieval_args(parser)
    parser.add_argument("--backend", default=None,
                        help="compare these ANNS backends (comma-separated: diskannpy,milvus) instead of the stage "
                             "bench of one index")
    parser.add_argument("--milvus-uri", default="", help="Milvus to use (default: start an embedded server)")
    parser.add_argument("--milvus-index", choices=["auto", "DISKANN", "HNSW"], default="auto")
    parser.add_argument("--milvus-data", type=Path, default=None,
                        help="the embedded server's data folder (default: a temporary one)")
    parser.add_argument("--runs", type=int, default=3, help="runs (seeds 0..runs-1)")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="quality questions for hit@5")


def run(args: argparse.Namespace) -> int:
    if args.backend is None:
        from retriever_svc.retrieval_bench import run_bench_retrieval

        return run_bench_retrieval(args)
    backends = [name.strip() for name in args.backend.split(",") if name.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if not backends or unknown:
        print(f"error: --backend takes {', '.join(BACKENDS)} (comma-separated), got {args.backend!r}", file=sys.stderr)
        return 1
    if args.runs < 1 or args.queries < 1:
        print("error: --runs and --queries must be at least 1", file=sys.stderr)
        return 1
    try:
        result = compare(args, backends)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_rows(result))
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


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
    def stat(values: list[float], digits: int = 4) -> dict:
        return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
                "max": round(max(values), digits)}

    row = {key: stat([r[key] for r in runs]) for key in
           ("recall_at_10", "first_emit_fraction", "first_emit_ms", "full_search_ms", "hit_at_5")}
    row["concurrency"] = [{"clients": clients,
                           **{key: stat([r["concurrency"][i][key] for r in runs], 3) for key in ("p50_ms", "p99_ms",
                                                                                                  "qps")}}
                          for i, clients in enumerate(CONCURRENCY)]
    return row


def compare(args: argparse.Namespace, backends: list[str]) -> dict:
    from load_tests.quality import load_questions
    from retriever_svc.anns.backend import DEFAULT_BEAM_WIDTH, DEFAULT_SCHEDULE, parse_beam_width, parse_schedule
    from retriever_svc.anns.index import AnnsIndex
    from retriever_svc.anns.stages import effective_schedule
    from retriever_svc.corpus.embedding import embed
    from retriever_svc.corpus.index import default_index_dir
    from retriever_svc.retrieval_bench import derive_queries

    schedule = parse_schedule(args.l_schedule) if args.l_schedule else DEFAULT_SCHEDULE
    width = parse_beam_width(args.beam_width) if args.beam_width is not None else DEFAULT_BEAM_WIDTH
    directory = args.index or default_index_dir()
    local = AnnsIndex(directory)
    texts = [p.text for p in local.store.all()]
    questions = load_questions(args.questions)
    question_vectors = embed([q.question for q in questions])
    query_vectors = [embed(derive_queries(texts, args.queries, seed)) for seed in range(args.runs)]
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
            for seed in range(args.runs):
                runs.append(measure(index, query_vectors[seed], question_vectors, questions, k, sizes))
                print(f"{name}: run {seed + 1}/{args.runs}: recall@{k} {runs[-1]['recall_at_10']:.3f}, "
                      f"hit@5 {runs[-1]['hit_at_5']:.3f}, first emit {runs[-1]['first_emit_fraction']:.0%}", flush=True)
            rows.append({"backend": name, "index": label, **summarize(runs), "runs": runs})
    finally:
        for close in reversed(cleanup):
            close()
    return {"command": "streamrag bench retrieval --backend " + ",".join(backends), "k": k,
            "queries_per_run": args.queries, "runs": args.runs, "quality_questions": len(questions),
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
             f"{result['queries_per_run']} queries x {result['runs']} runs (median [min, max])",
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
