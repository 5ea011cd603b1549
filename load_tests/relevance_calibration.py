"""`streamrag bench relevance`: calibrate the crawler's two relevance constants on a question set.

    streamrag serve corpus --port 8799 &
    streamrag serve retriever --kind crawler --port 50070 --min-relevance 0 \\
        --start-url http://127.0.0.1:8799/ &
    streamrag bench relevance --questions load_tests/quality_questions.jsonl --crawler 127.0.0.1:50070 \\
        --json out/relevance.json

Asks a crawler that keeps every page (`--min-relevance 0`) for up to `--pages` pages per
question, and records each kept page's relevance score (`Document.score`, 0..1) in arrival
order, and whether it answers the question. From that one run it then replays the choice of
each constant offline:

- `min_relevance` (retriever_svc/server_args.py): for each threshold, the pages the crawler
  would have kept (score at least the threshold, in the same order, the first `--top-k` of
  them), their hit@k, how many of them do not answer, and how many questions are left with no
  page at all. The crawl's order does not depend on the threshold (it only filters what is
  sent), so the replay is what the crawler would have done.
- `RELEVANCE_MARGIN` (orchestrator/documents.py): for each margin, the share of kept pages
  that would move before an earlier page (each such move is an `update` that invalidates the
  KV of the pages behind it), and how often a move brings an answering page forward.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from load_tests.quality import Question, answers, page_of, questions_or_none
from load_tests.runner import write_json

THRESHOLDS = (0.0, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
MARGINS = (0.0, 0.05, 0.1, 0.2, 0.3)


@dataclass(frozen=True)
class CrawledPage:
    page: str
    score: float
    answers: bool


def crawl_one(stub, question: Question, pages: int, deadline_ms: int) -> list[CrawledPage]:
    """Every page the crawler sends for `question`, in arrival order."""
    from protos import retriever_pb2

    request = retriever_pb2.RetrieveRequest(query=question.question, top_k=pages, deadline_ms=deadline_ms,
                                            request_id=f"calibrate-{question.id}")
    crawled = []
    for response in stub.Retrieve(request, timeout=deadline_ms / 1000 + 30):
        for doc in response.chunk.documents:
            crawled.append(CrawledPage(page_of(doc.url), doc.score, answers(doc.url, question.pages)))
    return crawled


def threshold_row(crawls: Sequence[list[CrawledPage]], threshold: float, top_k: int) -> dict:
    """What the crawler would have sent with `min_relevance = threshold`."""
    kept = [[p for p in crawl if p.score >= threshold][:top_k] for crawl in crawls]
    hits = sum(any(p.answers for p in pages) for pages in kept)
    noise = sum(sum(not p.answers for p in pages) for pages in kept)
    return {"threshold": threshold, "hit_at_k": round(hits / len(crawls), 4),
            "pages_mean": round(sum(map(len, kept)) / len(crawls), 2),
            "non_answering_mean": round(noise / len(crawls), 2),
            "empty": sum(not pages for pages in kept)}


def margin_row(crawls: Sequence[list[CrawledPage]], threshold: float, top_k: int, margin: float) -> dict:
    """How many kept pages would move before an earlier page under `margin`."""
    moved = moved_answering = total = 0
    for crawl in crawls:
        kept = [p for p in crawl if p.score >= threshold][:top_k]
        for i, page in enumerate(kept):
            total += 1
            if any(earlier.score < page.score - margin for earlier in kept[:i]):
                moved += 1
                moved_answering += page.answers
    return {"margin": margin, "moved_share": round(moved / total, 4) if total else 0.0,
            "moved_answering": moved_answering, "pages": total}


def render(thresholds: list[dict], margins: list[dict], top_k: int, current: float, margin_now: float) -> str:
    lines = [f"| min_relevance | hit@{top_k} | pages sent (mean) | of them not answering | questions with no page |",
             "|---:|---:|---:|---:|---:|"]
    for row in thresholds:
        mark = " (default)" if abs(row["threshold"] - current) < 1e-9 else ""
        lines.append(f"| {row['threshold']:.2f}{mark} | {row['hit_at_k']:.0%} | {row['pages_mean']:.1f} "
                     f"| {row['non_answering_mean']:.1f} | {row['empty']} |")
    lines += ["", f"| margin (at min_relevance {current}) | pages that would move forward | "
                  "of them answering |", "|---:|---:|---:|"]
    for row in margins:
        mark = " (default)" if abs(row["margin"] - margin_now) < 1e-9 else ""
        lines.append(f"| {row['margin']:.2f}{mark} | {row['moved_share']:.0%} of {row['pages']} "
                     f"| {row['moved_answering']} |")
    return "\n".join(lines)


def add_bench_relevance_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--questions", type=Path, required=True, help="question file (JSON lines with pages)")
    parser.add_argument("--crawler", required=True,
                        help="host:port of a crawler retriever started with --min-relevance 0")
    parser.add_argument("--pages", type=int, default=30, help="pages asked for per question (the crawl's cap)")
    parser.add_argument("--top-k", type=int, default=5, help="pages the crawler sends per question (hit@k)")
    parser.add_argument("--deadline-ms", type=int, default=120_000,
                        help="per-question retrieval deadline: long, so that the scores, not the speed of this "
                             "machine, decide what is kept")
    parser.add_argument("--json", type=Path, default=None, help="write every crawled page and the tables here")


def run_bench_relevance(args: argparse.Namespace) -> int:
    import grpc

    from orchestrator.documents import RELEVANCE_MARGIN
    from protos import retriever_pb2, retriever_pb2_grpc
    from retriever_svc.server_args import CRAWLER_MIN_RELEVANCE

    if (questions := questions_or_none(args.questions)) is None:
        return 2
    if args.pages < 1 or args.top_k < 1 or args.deadline_ms < 1:
        print("error: --pages, --top-k and --deadline-ms must be at least 1", file=sys.stderr)
        return 2
    started = time.monotonic()
    crawls: list[list[CrawledPage]] = []
    with grpc.insecure_channel(args.crawler) as channel:
        stub = retriever_pb2_grpc.RetrieverStub(channel)
        try:
            info = stub.Describe(retriever_pb2.RetrieverDescribeRequest(), timeout=30).retriever_info
        except grpc.RpcError as exc:
            print(f"error: no retriever at {args.crawler}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
        if float(info.facts.get("min_relevance", "nan")) != 0.0:
            print(f"error: the crawler at {args.crawler} drops pages below {info.facts.get('min_relevance')}: "
                  "start it with --min-relevance 0 so every threshold can be replayed", file=sys.stderr)
            return 2
        for i, question in enumerate(questions, start=1):
            try:
                crawl = crawl_one(stub, question, args.pages, args.deadline_ms)
            except grpc.RpcError as exc:
                print(f"error: {question.id}: {exc.code().name}: {exc.details()}", file=sys.stderr)
                return 1
            crawls.append(crawl)
            best = max((p.score for p in crawl if p.answers), default=None)
            print(f"[{i}/{len(questions)}] {question.id}: {len(crawl)} pages, answering page "
                  + (f"score {best:.3f}" if best is not None else "not crawled"), file=sys.stderr, flush=True)
    thresholds = [threshold_row(crawls, t, args.top_k) for t in THRESHOLDS]
    margins = [margin_row(crawls, CRAWLER_MIN_RELEVANCE, args.top_k, m) for m in MARGINS]
    print(render(thresholds, margins, args.top_k, CRAWLER_MIN_RELEVANCE, RELEVANCE_MARGIN))
    if args.json:
        write_json(args.json, {
            "questions": str(args.questions), "crawler": args.crawler, "pages": args.pages, "top_k": args.top_k,
            "deadline_ms": args.deadline_ms,
            "duration_s": round(time.monotonic() - started, 1), "thresholds": thresholds, "margins": margins,
            "crawls": {q.id: [asdict(p) for p in c] for q, c in zip(questions, crawls, strict=True)}})
    return 0
