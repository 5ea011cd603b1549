"""One seed of `bench sessions`: a session grown through every point, each growth ingested in two
halves (one alone, one with session queries running), then measured at that point: session
queries, Flash hits, and Generate cold and warm on the same context."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from load_tests.sessions.client import SessionsClient
from load_tests.sessions.flash_watcher import FlashWatcher
from load_tests.sessions.workload import FLASH_QUESTION, FLASH_VARIANTS, INSTRUCTIONS, QUESTIONS, LogFeed
from servicekit.progress import say


def _ingest_timed(client: SessionsClient, session_id: str, feed: LogFeed, tokens: int, data: list[str],
                  with_queries: bool, rng: random.Random) -> dict[str, Any]:
    """Ingest about `tokens` of data; tokens/s from the call until the state has computed it all,
    with a thread asking session queries meanwhile when `with_queries`."""
    segments = feed.take(tokens)
    texts = [text for text, _ in segments]
    before = client.describe(session_id).computed_tokens
    stop = threading.Event()
    ttfts: list[float] = []

    def ask() -> None:
        while not stop.is_set():
            ttfts.append(client.query(session_id, rng.choice(QUESTIONS)).ttft_ms)
            stop.wait(0.05)

    asker = threading.Thread(target=ask, name="bench-ingest-queries", daemon=True) if with_queries else None
    started = time.perf_counter()
    if asker:
        asker.start()
    response = client.ingest(session_id, texts)
    info = client.wait_ready(session_id)
    seconds = time.perf_counter() - started
    stop.set()
    if asker:
        asker.join(timeout=600)
    data.extend(texts)
    computed = info.computed_tokens - before
    return {"with_queries": with_queries, "tokens": computed, "seconds": seconds,
            "tokens_per_s": computed / seconds, "queries": len(ttfts),
            "query_ttft_ms": statistics.median(ttfts) if ttfts else None, "data_version": response.data_version}


def run_seed(client: SessionsClient, seed: int, points: Sequence[int], args: argparse.Namespace,
             count_tokens: Callable[[str], int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[list[str]]]:
    """One session grown through `points`: per-point measurements, ingestion runs, and the data
    at each point (for the vLLM baseline)."""
    from protos import sessions_pb2

    rng = random.Random(seed)
    session_id = f"bench-{seed}-{os.getpid()}-{int(time.time())}"
    info = client.sessions.CreateSession(sessions_pb2.CreateSessionRequest(
        session_id=session_id, instructions=INSTRUCTIONS), timeout=120).session
    client.sessions.RegisterFlashQuery(sessions_pb2.RegisterFlashQueryRequest(
        session_id=session_id, question=FLASH_QUESTION, max_tokens=args.flash_max_tokens), timeout=60)
    watcher = FlashWatcher(client, session_id)
    feed = LogFeed(seed, count_tokens)
    data: list[str] = []
    rows: list[dict[str, Any]] = []
    ingestion: list[dict[str, Any]] = []
    contexts: list[list[str]] = []
    try:
        for index, target in enumerate(points):
            current = client.describe(session_id)
            need = target - (current.head_tokens + current.data_tokens)
            if need <= 0:
                raise ValueError(f"point {target} is not above the session's {current.head_tokens} head tokens "
                                 "or the previous point")
            halves = (False, True) if index % 2 == 0 else (True, False)
            for i, with_queries in enumerate(halves):
                part = need // 2 if i == 0 else target - (client.describe(session_id).head_tokens
                                                          + client.describe(session_id).data_tokens)
                if part <= 0:
                    continue
                run = _ingest_timed(client, session_id, feed, part, data, with_queries,
                                    random.Random(f"{seed}-{target}-{i}"))
                run.update(seed=seed, point=target, context_tokens=client.describe(session_id).computed_tokens)
                ingestion.append(run)
                say(f"  seed {seed} -> {run['context_tokens']} tokens: ingested {run['tokens']} in "
                     f"{run['seconds']:.1f}s ({run['tokens_per_s']:.0f} tok/s"
                     + (f", {run['queries']} queries meanwhile, TTFT p50 {run['query_ttft_ms']:.0f} ms)"
                        if with_queries and run['queries'] else ")"))
            info = client.wait_ready(session_id)
            context = info.head_tokens + info.data_tokens
            flash = watcher.wait(info.data_version)
            contexts.append(list(data))

            questions = rng.sample(QUESTIONS, args.questions + args.warm_repeats + 1)
            session_q = [client.query(session_id, q) for q in questions[:args.questions]]
            flash_q = [client.query(session_id, FLASH_VARIANTS[i % len(FLASH_VARIANTS)])
                       for i in range(args.flash_repeats)]
            if not all(r.flash_hit for r in flash_q):
                raise RuntimeError(f"a registered question missed the Flash cache at data version {info.data_version}")

            tag = f"[run {seed}-{index}-{os.getpid()}-{time.time_ns()}] "     # defeats the prefix cache
            rest = questions[args.questions:]
            cold_ms, cold = client.generate(client.segments(tag + INSTRUCTIONS, data, rest[0]))
            warm = [client.generate(client.segments(tag + INSTRUCTIONS, data, q)) for q in rest[1:]]
            row = {
                "seed": seed, "point": target, "context_tokens": context, "data_version": info.data_version,
                "session_query_ttft_ms": statistics.median(r.ttft_ms for r in session_q),
                "session_query_server_ttft_ms": statistics.median(r.server_ttft_ms for r in session_q),
                "session_query_ttfts_ms": [r.ttft_ms for r in session_q],
                "session_shared_tokens": min(r.shared_tokens for r in session_q),
                "session_context_tokens": max(r.context_tokens for r in session_q),
                "session_tokens_computed": max(r.tokens_computed for r in session_q),
                "generate_ttft_ms": cold_ms,
                "generate_prompt_tokens": cold.stats.prompt_tokens,
                "generate_prefix_hit_tokens": cold.stats.prefix_cache_hit_tokens,
                "prefix_cache_ttft_ms": statistics.median(ms for ms, _ in warm),
                "prefix_cache_ttfts_ms": [ms for ms, _ in warm],
                "prefix_cache_hit_tokens": min(done.stats.prefix_cache_hit_tokens for _, done in warm),
                "flash_hit_ms": statistics.median(r.ttft_ms for r in flash_q),
                "flash_hit_server_ms": statistics.median(r.server_ttft_ms for r in flash_q),
                "flash_eval_ms": flash.eval_ms,
                "flash_answer": flash.answer,
            }
            rows.append(row)
            say(f"seed {seed} {context:>5} tokens: session query {row['session_query_ttft_ms']:7.1f} ms | Generate "
                 f"{cold_ms:8.1f} ms | prefix cache {row['prefix_cache_ttft_ms']:6.1f} ms | Flash hit "
                 f"{row['flash_hit_ms']:5.2f} ms (server {row['flash_hit_server_ms']:.2f}) | shared "
                 f"{row['session_shared_tokens']}/{row['session_context_tokens']}")
    finally:
        watcher.stop()
        client.sessions.CloseSession(sessions_pb2.CloseSessionRequest(session_id=session_id), timeout=120)
    return rows, ingestion, contexts
