"""`streamrag bench ingest`: your own documents, live — embedding speed, insert-to-searchable, recall
after churn, and search latency while ingesting.

Each run (seed) starts a real ANNS retriever process on loopback with an empty collections folder,
and uses real files: HTML pages of the Python docs (or --source), shuffled by the seed.
1. **Base**: the first part of the files is added and merged into a DiskANN disk index.
2. **Idle searches**: Retrieve at 2 searches/s for --idle-s seconds (questions drawn from passages).
3. **Ingesting**: the next files are added one at a time (each `AddFiles` answered once the file
   is searchable: its time is insert-to-searchable, measured by this client) while searches go on
   at 2/s; then files holding about half of the base's passages are removed.
4. **Recall after churn**: recall@10 of the final stage against exact search over the live
   passages (the service's `measure_recall` option), before and after a merge.
Embedding speed is measured in this process on the same passages: the default backend against
today's torch path (`embed_passages_per_s_before`).

    streamrag bench ingest --json ingest.json

writes the medians over seeds at the top level (the keys below) and `runs` per seed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from load_tests.runner import add_seeds_arg, positive_int, write_json
from servicekit.progress import say

DOCS_ROOT = Path("/usr/share/doc/python3.11/html")
SEARCH_QPS = 2.0
KEYS = ("embed_passages_per_s", "embed_passages_per_s_before", "insert_to_searchable_p50_s",
        "insert_to_searchable_p99_s", "recall_at_10_after_churn", "recall_at_10_after_churn_merged",
        "search_p99_ms_idle", "search_p99_ms_ingesting")


def add_bench_ingest_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", type=Path, default=DOCS_ROOT, help="folder of documents (html, md, rst, txt, pdf)")
    parser.add_argument("--base-files", type=positive_int, default=150, help="files in the merged base")
    parser.add_argument("--ingest-files", type=positive_int, default=75, help="files added while searching")
    parser.add_argument("--idle-s", type=positive_int, default=20, help="seconds of searches with no ingestion")
    parser.add_argument("--embed-passages", type=positive_int, default=600, help="passages for the embedding speed")
    add_seeds_arg(parser, what="seeds: each shuffles the files its own way; medians are reported")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def embedding_rates(files: list[Path], passages: int) -> tuple[float, float]:
    """(default backend, today's torch path) passages/s on the passages of `files`."""
    from retriever_svc.collections.collection import file_passages
    from retriever_svc.corpus.index import embed_passages, token_counter

    count = token_counter()
    sample = []
    for path in files:
        sample += file_passages(str(path), path.read_bytes(), "0" * 12, count)
        if len(sample) >= passages:
            break
    sample = sample[:passages]
    rates = []
    for backend in ("default", "torch"):
        embed_passages(sample[:32], "auto", progress=False, **_backend(backend))       # load and warm up
        started = time.perf_counter()
        embed_passages(sample, "auto", progress=False, **_backend(backend))
        rates.append(len(sample) / (time.perf_counter() - started))
    return rates[0], rates[1]


def _backend(name: str) -> dict[str, str]:
    return {} if name == "default" else {"backend": name}


class Retriever:
    """A real ANNS retriever process serving only live collections, on a free loopback port."""

    def __init__(self, collections: Path) -> None:
        import grpc

        from protos import retriever_pb2_grpc

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "retriever_svc.server", "--kind", "anns", "--index", "none", "--collections",
             str(collections), "--port", "0", "--metrics-port", "0", "--log-level", "WARNING"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        port = None
        for line in self.proc.stdout:                 # "anns retriever on 127.0.0.1:PORT (metrics ...)"
            if " retriever on " in line:
                port = int(line.split(" retriever on ")[1].split()[0].rpartition(":")[2])
                break
        if port is None:
            raise RuntimeError(f"the retriever exited with code {self.proc.wait()} before serving")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()   # DiskANN's build lines
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("grpc.max_send_message_length", 64 * 2**20)])
        self.retriever = retriever_pb2_grpc.RetrieverStub(self.channel)
        self.collections = retriever_pb2_grpc.CollectionsStub(self.channel)

    def add(self, collection: str, path: Path) -> tuple[float, int]:
        from protos import retriever_pb2 as pb

        started = time.perf_counter()
        request = pb.AddFilesRequest(collection=collection, path=str(path), content=path.read_bytes())
        (answer,) = list(self.collections.AddFiles(iter([request]), timeout=600))
        return time.perf_counter() - started, answer.passages if answer.status != pb.ADD_FILE_STATUS_FAILED else 0

    def search(self, collection: str, question: str, recall: bool = False) -> tuple[float, float | None]:
        from protos import retriever_pb2 as pb

        started = time.perf_counter()
        options = {"measure_recall": "true"} if recall else {}
        final = None
        for response in self.retriever.Retrieve(pb.RetrieveRequest(query=question, top_k=10, collection=collection,
                                                                    options=options), timeout=60):
            final = response.chunk
        measured = final.stage.recall_at_k if final is not None and final.stage.HasField("recall_at_k") else None
        return time.perf_counter() - started, measured

    def close(self) -> None:
        self.channel.close()
        self.proc.kill()
        self.proc.wait()


class Searcher(threading.Thread):
    """Retrieve at a steady rate until stopped; each latency is recorded with the phase it started in."""

    def __init__(self, retriever: Retriever, collection: str, questions: list[str]) -> None:
        super().__init__(daemon=True)
        self.retriever, self.collection, self.questions = retriever, collection, questions
        self.phase = "idle"
        self.latencies: dict[str, list[float]] = {"idle": [], "ingesting": []}
        self._halt = threading.Event()

    def run(self) -> None:
        period = 1.0 / SEARCH_QPS
        next_at = time.perf_counter()
        for i in range(10**9):
            if self._halt.wait(max(0.0, next_at - time.perf_counter())):
                return
            phase = self.phase
            elapsed, _ = self.retriever.search(self.collection, self.questions[i % len(self.questions)])
            self.latencies[phase].append(elapsed)
            next_at += period

    def stop(self) -> None:
        self._halt.set()
        self.join()


def questions_from(files: list[Path], count: int, rng: random.Random) -> list[str]:
    """Sentences from the files' passages, as questions a reader of them might search for."""
    from retriever_svc.collections.collection import file_passages
    from retriever_svc.corpus.passages import approx_tokens

    sentences = []
    for path in files:
        for passage in file_passages(str(path), path.read_bytes(), "0" * 12, approx_tokens):
            sentences += [s.strip() for s in passage.text.split(". ") if 40 <= len(s.strip()) <= 200]
    return rng.sample(sentences, min(count, len(sentences)))


def run_once(files: list[Path], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from protos import retriever_pb2 as pb

    rng = random.Random(seed)
    files = rng.sample(files, len(files))
    base, incoming = files[:args.base_files], files[args.base_files:args.base_files + args.ingest_files]
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as folder:
        retriever = Retriever(Path(folder))
        try:
            retriever.collections.CreateCollection(pb.CreateCollectionRequest(name="bench"), timeout=30)
            say(f"seed {seed}: adding {len(base)} base files")
            base_passages = {path: retriever.add("bench", path)[1] for path in base}
            retriever.collections.MergeCollection(pb.MergeCollectionRequest(name="bench"), timeout=3600)
            questions = questions_from(base + incoming, 200, rng)
            searcher = Searcher(retriever, "bench", questions)
            searcher.start()
            say(f"seed {seed}: {args.idle_s} s of idle searches at {SEARCH_QPS:g}/s")
            time.sleep(args.idle_s)
            searcher.phase = "ingesting"
            say(f"seed {seed}: adding {len(incoming)} files while searching")
            inserts = [retriever.add("bench", path)[0] for path in incoming]
            searcher.stop()
            # Remove base files until about half of the base's passages are gone.
            target, removed = sum(base_passages.values()) / 2, 0
            doomed = []
            for path in base:
                if removed >= target:
                    break
                doomed.append(str(path))
                removed += base_passages[path]
            retriever.collections.RemoveFiles(pb.RemoveFilesRequest(collection="bench", paths=doomed), timeout=300)
            churn_questions = questions[:50]
            before = [retriever.search("bench", q, recall=True)[1] for q in churn_questions]
            retriever.collections.MergeCollection(pb.MergeCollectionRequest(name="bench"), timeout=3600)
            after = [retriever.search("bench", q, recall=True)[1] for q in churn_questions]
        finally:
            retriever.close()
    return {"seed": seed, "base_passages": sum(base_passages.values()), "removed_passages": removed,
            "inserted_files": len(inserts), "insert_to_searchable_p50_s": statistics.median(inserts),
            "insert_to_searchable_p99_s": percentile(inserts, 99),
            "recall_at_10_after_churn": statistics.fmean(r for r in before if r is not None),
            "recall_at_10_after_churn_merged": statistics.fmean(r for r in after if r is not None),
            "search_p99_ms_idle": 1000 * percentile(searcher.latencies["idle"], 99),
            "search_p99_ms_ingesting": 1000 * percentile(searcher.latencies["ingesting"], 99),
            "searches_idle": len(searcher.latencies["idle"]),
            "searches_ingesting": len(searcher.latencies["ingesting"])}


def run_bench_ingest(args: argparse.Namespace) -> int:
    from retriever_svc.corpus.loaders import iter_files

    files = [path for path, error in iter_files([args.source]) if error is None
             and path.name not in ("genindex-all.html", "search.html")]
    if len(files) < args.base_files + args.ingest_files:
        print(f"error: {args.source} has {len(files)} readable files; the benchmark needs "
              f"{args.base_files + args.ingest_files}", file=sys.stderr)
        return 1
    say(f"embedding speed on {args.embed_passages} passages: default backend, then today's torch path")
    rate, rate_before = embedding_rates(random.Random(0).sample(files, len(files)), args.embed_passages)
    runs = [run_once(files, args, seed) for seed in args.seeds]
    result: dict[str, Any] = {"embed_passages_per_s": rate, "embed_passages_per_s_before": rate_before}
    for key in KEYS[2:]:
        values = [run[key] for run in runs]
        result[key] = statistics.median(values)
        result[f"{key}_range"] = [min(values), max(values)]
    result |= {"machine": _machine(), "command": "streamrag bench ingest " + " ".join(sys.argv[3:]), "runs": runs}
    print("| measure | median | min-max |\n|---|---|---|")
    print(f"| embedding passages/s (before) | {rate:.1f} ({rate_before:.1f}) | |")
    for key in KEYS[2:]:
        low, high = result[f"{key}_range"]
        print(f"| {key} | {result[key]:.3f} | {low:.3f}-{high:.3f} |")
    if args.json:
        write_json(args.json, result)
    return 0


def _machine() -> str:
    from servicekit.hardware import cpu_kind

    return cpu_kind()
