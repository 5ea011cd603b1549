"""`streamrag ask`: a question to the Orchestrator API, its answer as it streams.

`ask` prints the answer as it streams, with a live status line on stderr (retrieval chunks,
engine lifecycle), then the sources (each page once, however many of its passages were in the
prompt) and both latencies; `--json` prints one JSON object. Without `--orchestrator` it talks to
every orchestrator of the local stack `streamrag up` started, else to 127.0.0.1:50051 (where it
finds them: `streamrag.stack.addresses`; a request's recorded lifecycle: `streamrag requests`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import grpc

from inference_svc.engine.options import (
    DEFAULT_SPECULATION,
    KV_REUSE_CHOICES,
    MAX_SPECULATION_DEPTH,
    blend_recompute_arg,
    speculation_arg,
)
from protos import common_pb2, orchestrator_pb2, orchestrator_pb2_grpc
from protos.retrievers import RETRIEVER_CHOICES
from servicekit.ask_resume import ResumableAsk
from servicekit.auth import client_key
from servicekit.channels import open_channel, spread_options, spread_target
from servicekit.tls import ORCHESTRATORS, client_tls
from streamrag.stack.addresses import DEFAULT_ORCHESTRATOR, orchestrator_address


def add_ask_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question")
    parser.add_argument("--retriever", choices=list(RETRIEVER_CHOICES), default=None,
                        help="default: the orchestrator's (anns; the crawler, with a warning, while anns cannot serve)")
    parser.add_argument("--no-stream", action="store_true", help="the baseline: prompt sent once retrieval ends")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--speculation", type=speculation_arg, default=DEFAULT_SPECULATION,
                        help="speculative decoding drafted from the retrieved context: off, auto or a fixed depth "
                             f"0..{MAX_SPECULATION_DEPTH} (default {DEFAULT_SPECULATION})")
    parser.add_argument("--kv-reuse", choices=KV_REUSE_CHOICES, default=None,
                        help="exact: only an identical prefix's KV is reused; blend: cached retrieved passages are "
                             "reused at new positions, a share recomputed (approximate; default: the server's)")
    parser.add_argument("--blend-recompute", type=blend_recompute_arg, default=None,
                        help="with --kv-reuse blend: share of a reused passage's tokens recomputed, in [0, 1] "
                             "(default: the server's, 0.15)")
    parser.add_argument("--collection", default="",
                        help="search this collection of your own documents (anns; default: the bundled docs)")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--deadline-ms", type=int, default=0, help="retrieval deadline")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end instead")
    parser.add_argument("--orchestrator", default=None,
                        help=f"host:port, or several comma-separated (asks are spread over them and resume on "
                             f"another when one dies; default: the local stack's, else {DEFAULT_ORCHESTRATOR})")
    parser.add_argument("--timeout", type=float, default=600.0)


def unique_sources(sources) -> list[tuple[common_pb2.Document, int]]:
    """Each page once, in order of first appearance, with how many of its passages were used.

    Passages of one page share its URL; a source without a URL is its own page.
    """
    pages: dict[str, tuple[common_pb2.Document, int]] = {}
    for source in sources:
        key = source.url or f"id:{source.id}"
        first, count = pages.get(key, (source, 0))
        pages[key] = (first, count + 1)
    return list(pages.values())


def source_line(source: common_pb2.Document, passages: int) -> str:
    more = f" ({passages} passages)" if passages > 1 else ""
    return f"  - {source.title or source.id}  {source.url}{more}"


class StatusLine:
    """One self-overwriting line on stderr (only on a terminal)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()

    def show(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K" + text[:150])
            sys.stderr.flush()

    def clear(self) -> None:
        self.show("")


async def stream_answer(request: orchestrator_pb2.AskRequest, address: str, timeout_s: float, status: StatusLine,
                        print_tokens: bool = True) -> orchestrator_pb2.AskDone | None:
    """Ask, showing progress on `status` and the answer on stdout as it streams; the `done` event.

    `address` may name several orchestrators ("a:port,b:port"): asks are spread over them by gRPC's
    round_robin with health checking, and an Ask whose orchestrator dies mid-answer is re-issued to
    another as a resume, which continues where the answer stopped (servicekit.ask_resume). Every
    call waits for an orchestrator to be ready within the timeout (one restarting, or just back)."""
    started = time.monotonic()
    answer_started = False
    chunks = 0
    done = None
    channel = open_channel(spread_target(address), client_tls(), options=spread_options(), api_key=client_key(),
                           server_name=ORCHESTRATORS)
    try:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        async for response in ResumableAsk(lambda ask: stub.Ask(ask, timeout=timeout_s), request):
            event = response.event
            kind = event.WhichOneof("kind")
            if kind == "retrieval":
                chunks += 1
                status.show(f"[{time.monotonic() - started:5.1f}s] retrieval: {chunks} chunks from "
                            f"{event.retrieval.source}, {event.retrieval.num_documents} documents")
            elif kind == "warning":     # the orchestrator says what the context lacks (context_warnings.py)
                status.clear()
                print(f"warning: {event.warning}", file=sys.stderr, flush=True)
            elif kind == "lifecycle" and not answer_started:
                name = common_pb2.LifecycleEventKind.Name(event.lifecycle.kind).removeprefix("LIFECYCLE_EVENT_KIND_")
                status.show(f"[{time.monotonic() - started:5.1f}s] engine: {name.lower()} "
                            f"{event.lifecycle.count or ''} ({chunks} retrieval chunks so far)")
            elif kind == "token" and print_tokens:
                if not answer_started:
                    status.clear()
                    answer_started = True
                sys.stdout.write(event.token.text)
                sys.stdout.flush()
            elif kind == "done":
                done = event.done
    finally:
        await channel.close()
    return done


def run_ask(args: argparse.Namespace) -> int:
    request = orchestrator_pb2.AskRequest(question=args.question, retriever=RETRIEVER_CHOICES.get(args.retriever, 0),
                                          no_stream=args.no_stream, max_tokens=args.max_tokens, top_k=args.top_k,
                                          retrieval_deadline_ms=args.deadline_ms, collection=args.collection,
                                          sampling=common_pb2.SamplingParams(
                                              speculation=args.speculation, kv_reuse=args.kv_reuse or "",
                                              blend_recompute=args.blend_recompute))
    status = StatusLine(not args.json)
    try:
        done = asyncio.run(stream_answer(request, orchestrator_address(args.orchestrator), args.timeout,
                                         status, print_tokens=not args.json))
    except grpc.RpcError as exc:
        status.clear()
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    status.clear()
    if done is None:
        print("error: the answer ended without a result", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({
            "request_id": done.request_id, "answer": done.answer, "streaming": not args.no_stream,
            "sources": [{"title": s.title, "url": s.url, "id": s.id, "passages": n}
                        for s, n in unique_sources(done.sources)],
            "ttft_from_question_s": round(done.ttft_from_question_s, 4),
            "ttft_after_retrieval_s": round(done.ttft_from_retrieval_end_s, 4),
            "retrieval_s": round(done.retrieval_s, 4), "total_s": round(done.total_s, 4), "replica": done.replica,
            "kv_reuse": done.stats.kv_reuse or "exact", "blend_reused_tokens": done.stats.blend_reused_tokens,
            "blend_recomputed_tokens": done.stats.blend_recomputed_tokens,
            "chunk_cache_hits": done.stats.chunk_cache_hits, "chunk_cache_lookups": done.stats.chunk_cache_lookups,
            "warnings": list(done.warnings),
        }))
        return 0
    print("\n\nSources:")
    for source, passages in unique_sources(done.sources):
        print(source_line(source, passages))
    mode = "streaming" if not args.no_stream else "non-streaming"
    print(f"\n{mode}: first token {done.ttft_from_question_s:.2f} s after the question, "
          f"{done.ttft_from_retrieval_end_s:.2f} s after retrieval ended ({done.retrieval_s:.2f} s); "
          f"request {done.request_id}")
    if done.stats.kv_reuse == "blend":
        s = done.stats
        print(f"kv reuse blend (approximate, not exact): {s.blend_reused_tokens} prompt tokens reused from "
              f"{s.chunk_cache_hits} of {s.chunk_cache_lookups} cached passages, {s.blend_recomputed_tokens} of "
              f"them recomputed")
    return 0
