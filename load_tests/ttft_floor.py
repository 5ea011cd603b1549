"""Per request: how much of its prompt streaming could have prefilled before the last chunk.

Streaming TTFT (first token minus the last chunk's arrival) cannot fall below the time to
prefill what arrives with, or is invalidated by, the last chunk: its new documents (append), or
everything from the first document that differs from the previous list (update), plus the
question repeated after the documents. Non-streaming prefills the whole prompt after the last
chunk. So, at zero load, a request's streaming speedup is bounded by about

    prompt tokens / tail tokens

and queueing (which non-streaming suffers more) is what can push a measured speedup past it.
This prints, for one `bench replay` run directory and its trace, the percentiles of the tail,
of that bound and of the measured TTFTs, and writes the per-request rows:

    streamrag bench ttft-floor out/paper/crawler-120.jsonl out/paper/crawler-high/seed-0

The tail is counted with the embedded model's tokenizer over the documents' texts (the prompt
template adds a few tokens per document), so the bound is an estimate within a few percent.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from load_tests.replay_run import stable_query
from load_tests.report import percentile
from load_tests.synth.tokens import DocTokens, EmbeddedTokenCounter
from retriever_svc.replay.trace import TraceDocument, TraceQuery, read_trace

SUFFIX_TEMPLATE_TOKENS = 12          # "Question again: " and the assistant turn header around the question


def tail_documents(query: TraceQuery) -> list[TraceDocument]:
    """The documents the last chunk brings or invalidates, in the orchestrator's (stable) order."""
    query = stable_query(query)
    before: list[TraceDocument] = []
    for chunk in query.chunks[:-1]:
        before = list(chunk.documents) if chunk.mode == "update" else before + list(chunk.documents)
    last = query.chunks[-1]
    if last.mode == "append":
        return list(last.documents)
    same = next((i for i, (a, b) in enumerate(zip(before, last.documents, strict=False)) if a.id != b.id),
                min(len(before), len(last.documents)))
    return list(last.documents[same:])


def floor_rows(queries: Sequence[TraceQuery], requests: Sequence[dict[str, Any]],
               tokens: DocTokens) -> list[dict[str, Any]]:
    """One row per query with both a streaming and a non-streaming result in `requests`."""
    by_query: dict[str, dict[bool, dict[str, Any]]] = {}
    for r in requests:
        if r.get("error") is None:
            by_query.setdefault(r["query_id"], {})[bool(r["streaming"])] = r
    rows = []
    for q in queries:
        pair = by_query.get(q.query_id, {})
        if True not in pair or False not in pair:
            continue
        s, ns = pair[True], pair[False]
        tail = sum(tokens(d) for d in tail_documents(q)) + tokens.counter.count(q.query) + SUFFIX_TEMPLATE_TOKENS
        prompt = s["prompt_tokens"]
        rows.append({"query_id": q.query_id, "prompt_tokens": prompt, "tail_tokens": min(tail, prompt),
                     "bound": prompt / max(min(tail, prompt), 1), "ttft_s": s["ttft_s"], "ttft_ns_s": ns["ttft_s"],
                     "speedup": ns["ttft_s"] / s["ttft_s"] if s["ttft_s"] > 0 else float("nan")})
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| percentile | prompt tokens | tail tokens | bound (prompt / tail) | streaming TTFT s "
             "| non-streaming TTFT s | measured speedup |", "|---|---:|---:|---:|---:|---:|---:|"]
    for p in (10, 50, 90, 99):
        cells = [percentile([r[k] for r in rows], p)
                 for k in ("prompt_tokens", "tail_tokens", "bound", "ttft_s", "ttft_ns_s", "speedup")]
        lines.append(f"| p{p} | {cells[0]:,.0f} | {cells[1]:,.0f} | {cells[2]:.2f}x | {cells[3]:.3f} | "
                     f"{cells[4]:.3f} | {cells[5]:.2f}x |")
    ratio = percentile([r["ttft_ns_s"] for r in rows], 50) / percentile([r["ttft_s"] for r in rows], 50)
    lines.append(f"\n{len(rows)} requests; speedup of the p50s {ratio:.2f}x; "
                 f"requests beyond their bound: {sum(r['speedup'] > r['bound'] for r in rows)}")
    return "\n".join(lines)


def add_bench_ttft_floor_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path, help="the trace the run replayed")
    parser.add_argument("run", type=Path, help="a `bench replay --out` directory (its requests.jsonl)")
    parser.add_argument("--config", default=None,
                        help="POLICY/EVICTION of the streaming rows to use (default: the run's first)")


def run_bench_ttft_floor(args: argparse.Namespace) -> int:
    try:
        queries = read_trace(args.trace).queries
        requests = [json.loads(line) for line in (args.run / "requests.jsonl").read_text().splitlines() if line]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    streaming = [r for r in requests if r["streaming"]]
    if not streaming:
        print(f"error: no streaming rows in {args.run / 'requests.jsonl'}", file=sys.stderr)
        return 2
    config = args.config or f"{streaming[0]['policy']}/{streaming[0]['eviction']}"
    chosen = [r for r in requests if not r["streaming"] or f"{r['policy']}/{r['eviction']}" == config]
    rows = floor_rows(queries, chosen, DocTokens(EmbeddedTokenCounter.load()))
    (args.run / "ttft_floor.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{args.run} ({config} against non-streaming)\n")
    print(table(rows))
    return 0

