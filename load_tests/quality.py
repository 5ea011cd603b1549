"""`streamrag bench quality`: does retrieval bring the page that answers the question?

    streamrag bench quality --questions load_tests/quality_questions.jsonl --json out/quality.json \\
        [--orchestrator 127.0.0.1:50051] [--retrievers anns,crawler,both] [--top-k 5] [--max-tokens 1]

Asks every question of the file through a running stack's orchestrator (`Ask`, streamed), once
per retriever choice, one Ask at a time, and for each Ask records:

- the sources (the documents of the final prompt, in prompt order) and the rank of the first
  one on an answering page: `hit@k` when that rank is at most k (k = 1, 3 and `--top-k`);
- the time to the first relevant chunk: seconds from the Ask's start to the retrieval event
  whose documents first include an answering page (only for Asks that found one);
- the time to the last chunk: the last retrieval event that arrived, and whether every
  retriever sent its final chunk before the orchestrator's retrieval deadline;
- what the prompt cost: its tokens, the appends and updates the engine received and the
  tokens they invalidated (how `both` mode's merge treats the KV cache).

A question file is JSON lines: `{"id", "section", "question", "pages": [page paths relative to
the docs root, any of which answers it]}` (load_tests/quality_questions.jsonl: 56 questions
about the Python docs, spread over library, tutorial, how-to and reference pages). A source
matches a page when its URL path (scheme, host and `#anchor` dropped) is the page or ends with
`/<page>`. Prints one table per run (and per section); `--json` writes every Ask and the summary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from load_tests.runner import write_json
from orchestrator.documents import page_of
from protos.retrievers import LIVE_RETRIEVERS, RETRIEVER_CHOICES
from servicekit.stats import percentile

DEFAULT_ORCHESTRATOR = "127.0.0.1:50051"    # servicekit.config.DEFAULT_PORTS["orchestrator"]
RETRIEVERS = LIVE_RETRIEVERS
SECTIONS = ("library", "tutorial", "howto", "reference")


@dataclass(frozen=True)
class Question:
    id: str
    section: str
    question: str
    pages: tuple[str, ...]


@dataclass
class AskOutcome:
    question_id: str
    section: str
    retriever: str
    sources: list[str] = field(default_factory=list)      # page path of each source, in prompt order
    hit_rank: int | None = None          # 1-based rank of the first source on an answering page
    first_relevant_s: float | None = None
    last_chunk_s: float | None = None
    finished: bool = False               # every retriever's final chunk arrived (no deadline cut it short)
    chunks: int = 0
    ttft_s: float | None = None
    prompt_tokens: int = 0
    num_appends: int = 0                 # prompt messages the engine received (what the merge cost in KV)
    num_updates: int = 0
    tokens_invalidated: int = 0
    error: str = ""


def load_questions(path: Path) -> list[Question]:
    """The questions of a JSON-lines file; ValueError naming the line when one is malformed."""
    questions: list[Question] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
            pages = tuple(str(p).strip("/") for p in obj["pages"])
            question = Question(str(obj["id"]), str(obj.get("section", "")), str(obj["question"]), pages)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: a question needs id, question and pages ({exc})") from None
        if not question.question.strip() or not pages:
            raise ValueError(f"{path}:{number}: empty question or no pages")
        questions.append(question)
    if len({q.id for q in questions}) != len(questions):
        raise ValueError(f"{path}: question ids repeat")
    return questions


def questions_or_none(path: Path) -> list[Question] | None:
    """`load_questions` for a command: None (after saying why on stderr) when the file is unusable."""
    try:
        return load_questions(path)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def answers(url: str, pages: Iterable[str]) -> bool:
    path = page_of(url)
    return any(path == page or path.endswith("/" + page) for page in pages)


def ask_one(stub, question: Question, retriever: str, *, top_k: int, max_tokens: int, deadline_ms: int,
            timeout_s: float) -> AskOutcome:
    """One streamed Ask; what it retrieved, when, and whether an answering page was among it."""
    import grpc

    from protos import orchestrator_pb2

    outcome = AskOutcome(question.id, question.section, retriever)
    request = orchestrator_pb2.AskRequest(question=question.question, retriever=RETRIEVER_CHOICES[retriever],
                                          top_k=top_k, max_tokens=max_tokens, retrieval_deadline_ms=deadline_ms)
    errors: list[str] = []
    finals = 0
    try:
        for response in stub.Ask(request, timeout=timeout_s):
            event = response.event
            kind = event.WhichOneof("kind")
            if kind == "retrieval":
                progress = event.retrieval
                outcome.chunks += 1
                finals += progress.final
                outcome.last_chunk_s = max(outcome.last_chunk_s or 0.0, progress.elapsed_s)
                if outcome.first_relevant_s is None and any(answers(d.url, question.pages)
                                                            for d in progress.documents):
                    outcome.first_relevant_s = progress.elapsed_s
            elif kind == "lifecycle" and event.lifecycle.detail.startswith("retriever "):
                errors.append(event.lifecycle.detail)
            elif kind == "done":
                done = event.done
                outcome.sources = [page_of(s.url) for s in done.sources]
                outcome.ttft_s = done.ttft_from_question_s
                stats = done.stats
                outcome.prompt_tokens, outcome.tokens_invalidated = stats.prompt_tokens, stats.tokens_invalidated
                outcome.num_appends, outcome.num_updates = stats.num_appends, stats.num_updates
    except grpc.RpcError as exc:
        errors.append(f"Ask failed: {exc.code().name}: {exc.details()}")
    outcome.error = "; ".join(errors)
    outcome.finished = finals >= (2 if retriever == "both" else 1)
    outcome.hit_rank = next((rank for rank, url in enumerate(outcome.sources, start=1)
                             if answers(url, question.pages)), None)
    return outcome


def _rate(outcomes: Sequence[AskOutcome], k: int) -> float:
    return sum(o.hit_rank is not None and o.hit_rank <= k for o in outcomes) / len(outcomes) if outcomes else math.nan


def _times(values: Iterable[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return {"p50": None, "p90": None}
    return {"p50": round(percentile(present, 50), 3), "p90": round(percentile(present, 90), 3)}


def summarize(outcomes: Sequence[AskOutcome], ks: Sequence[int]) -> dict:
    """Per retriever: Asks, hit@k, times (p50/p90), errors; and hit@k per docs section."""
    summary: dict[str, dict] = {}
    for retriever in dict.fromkeys(o.retriever for o in outcomes):
        mine = [o for o in outcomes if o.retriever == retriever]
        hits = [o for o in mine if o.hit_rank is not None and o.hit_rank <= max(ks)]
        summary[retriever] = {
            "asks": len(mine),
            "hit_at": {str(k): round(_rate(mine, k), 4) for k in ks},
            "found_anywhere": round(sum(o.hit_rank is not None for o in mine) / len(mine), 4),
            "first_relevant_chunk_s": _times(o.first_relevant_s for o in hits),
            "last_chunk_s": _times(o.last_chunk_s for o in mine),
            "ttft_s": _times(o.ttft_s for o in mine),
            "errors": sum(bool(o.error) for o in mine),
            "cut_by_deadline": sum(not o.finished and not o.error for o in mine),
            "prompt": {"tokens_mean": round(sum(o.prompt_tokens for o in mine) / len(mine), 1),
                       "appends": sum(o.num_appends for o in mine), "updates": sum(o.num_updates for o in mine),
                       "tokens_invalidated_mean": round(sum(o.tokens_invalidated for o in mine) / len(mine), 1)},
            "sections": {s: {"asks": len(part), f"hit_at_{max(ks)}": round(_rate(part, max(ks)), 4)}
                         for s in SECTIONS if (part := [o for o in mine if o.section == s])},
        }
    return summary


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(summary: dict, ks: Sequence[int]) -> str:
    k = max(ks)
    head = " | ".join(f"hit@{n}" for n in ks)
    lines = [f"| retriever | asks | {head} | first relevant chunk p50 / p90 s | last chunk p50 / p90 s "
             "| cut by the deadline | errors |", "|---|---:|" + "---:|" * len(ks) + "---:|---:|---:|---:|"]
    for retriever, s in summary.items():
        rates = " | ".join(f"{s['hit_at'][str(n)]:.0%}" for n in ks)
        first, last = s["first_relevant_chunk_s"], s["last_chunk_s"]
        lines.append(f"| {retriever} | {s['asks']} | {rates} | {_seconds(first['p50'])} / {_seconds(first['p90'])} "
                     f"| {_seconds(last['p50'])} / {_seconds(last['p90'])} | {s['cut_by_deadline']} | {s['errors']} |")
    lines += ["", "| retriever | " + " | ".join(SECTIONS) + f" (hit@{k}) |", "|---|" + "---:|" * len(SECTIONS)]
    for retriever, s in summary.items():
        cells = [f"{s['sections'][x][f'hit_at_{k}']:.0%} of {s['sections'][x]['asks']}" if x in s["sections"]
                 else "-" for x in SECTIONS]
        lines.append(f"| {retriever} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_bench_quality_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--questions", type=Path, required=True, help="question file (JSON lines with pages)")
    parser.add_argument("--json", type=Path, default=None, help="write every Ask and the summary here")
    parser.add_argument("--orchestrator", default=DEFAULT_ORCHESTRATOR, help="host:port of a running orchestrator")
    parser.add_argument("--retrievers", default=",".join(RETRIEVERS),
                        help="comma-separated retriever choices to measure (anns, crawler, both)")
    parser.add_argument("--top-k", type=int, default=5, help="documents per retriever (hit@k is measured at this k)")
    parser.add_argument("--max-tokens", type=int, default=1,
                        help="tokens to generate per Ask (the answer is not scored; 1 keeps runs short)")
    parser.add_argument("--deadline-ms", type=int, default=0, help="retrieval deadline (0: the orchestrator's)")
    parser.add_argument("--limit", type=int, default=0, help="ask only the first N questions (0: all)")


def run_bench_quality(args: argparse.Namespace) -> int:
    """Entry point: 0 when every Ask ran, 1 when some failed, 2 on bad arguments."""

    from protos import orchestrator_pb2_grpc
    from servicekit.auth import keyed_channel

    if (questions := questions_or_none(args.questions)) is None:
        return 2
    retrievers = [r.strip() for r in args.retrievers.split(",") if r.strip()]
    if not retrievers or any(r not in RETRIEVERS for r in retrievers) or args.top_k < 1:
        print(f"error: --retrievers takes {', '.join(RETRIEVERS)}; --top-k at least 1", file=sys.stderr)
        return 2
    questions = questions[: args.limit] if args.limit > 0 else questions
    ks = sorted({1, min(3, args.top_k), args.top_k})
    outcomes: list[AskOutcome] = []
    started = time.monotonic()
    with keyed_channel(args.orchestrator) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        for retriever in retrievers:
            for i, question in enumerate(questions, start=1):
                outcome = ask_one(stub, question, retriever, top_k=args.top_k, max_tokens=args.max_tokens,
                                  deadline_ms=args.deadline_ms, timeout_s=120.0)
                outcomes.append(outcome)
                mark = f"hit at {outcome.hit_rank}" if outcome.hit_rank else "miss"
                print(f"[{retriever} {i}/{len(questions)}] {question.id}: {mark}, first relevant "
                      f"{_seconds(outcome.first_relevant_s)} s, last chunk {_seconds(outcome.last_chunk_s)} s"
                      + (f"  ERROR {outcome.error}" if outcome.error else ""), file=sys.stderr, flush=True)
    summary = summarize(outcomes, ks)
    print(render(summary, ks))
    if args.json:
        write_json(args.json, {
            "questions": str(args.questions), "orchestrator": args.orchestrator, "top_k": args.top_k,
            "max_tokens": args.max_tokens, "duration_s": round(time.monotonic() - started, 1),
            "summary": summary, "asks": [asdict(o) for o in outcomes]})
    return 1 if any(o.error for o in outcomes) else 0
