"""`streamrag bench sessions`: time to first token of a session query as the session grows,
against Generate (cold), our prefix-cache path (warm Generate) and, when installed, vLLM's
prefix caching; Flash hits; ingestion throughput with and without queries running.

The real inference service runs as a subprocess on a loopback port (the service's defaults, dtype
`auto`: bf16 where the CPU has it) and everything goes through gRPC, as a client sees it. Per
seed, one session (instructions + a synthetic server log, deterministic per seed) grows to each
point of `--points` (tokens of head + data, default about 1k to 7.5k of SmolLM2's 8,192
positions). Growing to a point ingests the new data in two halves: one alone and one while a
thread asks session queries (which half comes first alternates by point), each timed from the
Ingest call until the session's state has computed every token (ingestion tokens/s). Then, once
the registered Flash question's answer for the new data version has arrived by Subscribe:

- `session_query_ttft_ms`: Sessions.Query, `max_tokens` 1, from sending the call to its first
  token; the median over `--questions` different questions;
- `flash_hit_ms`: Sessions.Query of the registered question (case and spacing varied), from
  sending to the answer, median over `--flash-repeats`; `flash_hit_server_ms` is the server's
  QueryDone.ttft_ms (its arrival at the server to its answer);
- `generate_ttft_ms` (cold): Inference.Generate on the same instructions + data + question
  segments, `max_tokens` 1, with the prefix cache defeated by a unique tag at the start of the
  instructions (a few tokens more than the session's context; `generate_prefix_hit_tokens`
  shows what the cache still matched: at most the chat prefix's first block);
- `prefix_cache_ttft_ms` (warm): Generate of that same context with a different question right
  after the cold one, median over `--warm-repeats` questions: the prefix-cache path;
- `vllm_prefix_cache_ttft_ms`: the same warm Generate against a `--backend vllm` service
  (its prefix caching) when `--vllm-python` has vllm (default /opt/vllm-venv), measured on the
  same contexts after the native runs.

Points are the median over seeds with the min-max spread (`_min`, `_max`); `runs` holds every
seed's measurements.

    flock /tmp/streamrag-cpu.lock python -m streamrag.cli bench sessions --json sessions.json

prints a markdown table and writes the JSON and a plot of TTFT against context size (beside the
JSON, `.png`, or `--plot`). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load_tests.cli_types import int_list, positive_int_list, write_json
from load_tests.seeds import spread
from servicekit.progress import say

INSTRUCTIONS = ("You are monitoring the server log in the data below. Answer the question about it "
                "briefly, quoting the host, time or status code that answers it.")
QUESTIONS = (
    "Which host logged the most errors?",
    "What was the last HTTP status code returned by web-2?",
    "Did the database report replication lag above 5 seconds?",
    "Which endpoint was the slowest request made to?",
    "When did cache-1 last restart?",
    "How many requests failed with status 503?",
    "Which user logged in most recently?",
    "Was any disk more than 90% full?",
    "Which deploy version is web-3 running?",
    "What is the first warning in the log?",
    "Did any host run out of memory?",
    "Which queue had the longest backlog?",
)
FLASH_QUESTION = "Is any host reporting errors right now?"
FLASH_VARIANTS = (FLASH_QUESTION, "is any host reporting errors right now?",
                  "  Is any host  reporting errors right now? ", "IS ANY HOST REPORTING ERRORS RIGHT NOW?")
DEFAULT_POINTS = "1000,2000,4000,6000,7500"
SEGMENT_LINES = 4               # log lines per data segment (about 150 tokens)
BATCH_SEGMENTS = 4              # segments per ingest batch (one data version)
METRICS = ("session_query_ttft_ms", "session_query_server_ttft_ms", "generate_ttft_ms", "prefix_cache_ttft_ms",
           "flash_hit_ms", "flash_hit_server_ms", "vllm_prefix_cache_ttft_ms")



# --- the data ---------------------------------------------------------------------------------

HOSTS = ("web-1", "web-2", "web-3", "api-1", "api-2", "db-1", "db-2", "cache-1", "queue-1", "auth-1")
PATHS = ("/api/orders", "/api/orders/{n}", "/api/users/{n}", "/api/cart", "/api/search?q=item{n}", "/login",
         "/api/payments", "/static/app.{n}.js", "/healthz", "/api/inventory/{n}")
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy")


def log_lines(rng: random.Random) -> Iterator[str]:
    """An endless, deterministic (per `rng`) server log: requests, warnings, errors, events."""
    t = 9 * 3600 + rng.randrange(3600)
    while True:
        t += rng.randrange(1, 9)
        stamp = f"2026-11-23T{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}Z"
        host = rng.choice(HOSTS)
        roll = rng.random()
        if roll < 0.62:
            path = rng.choice(PATHS).format(n=rng.randrange(1, 5000))
            status = rng.choices((200, 201, 204, 301, 404, 500, 503), (60, 8, 5, 3, 8, 2, 2))[0]
            level = "INFO" if status < 500 else "ERROR"
            yield (f"{stamp} {host} {level} {rng.choice(('GET', 'GET', 'POST', 'PUT'))} {path} {status} "
                   f"{rng.randrange(2, 900)}ms")
        elif roll < 0.74:
            address = f"10.0.{rng.randrange(256)}.{rng.randrange(256)}"
            yield f"{stamp} {host} INFO user {rng.choice(USERS)} logged in from {address}"
        elif roll < 0.84:
            yield rng.choice((
                f"{stamp} {host} WARN disk /var usage {rng.randrange(60, 99)}%",
                f"{stamp} {host} WARN replication lag {rng.randrange(1, 12)} s",
                f"{stamp} {host} WARN queue jobs backlog {rng.randrange(10, 5000)}",
                f"{stamp} {host} WARN memory usage {rng.randrange(70, 99)}%",
            ))
        elif roll < 0.92:
            yield rng.choice((
                f"{stamp} {host} ERROR upstream timeout after {rng.randrange(1, 30)} s",
                f"{stamp} {host} ERROR connection refused to db-{rng.randrange(1, 3)}:5432",
                f"{stamp} {host} ERROR out of memory: killed worker {rng.randrange(1, 64)}",
            ))
        else:
            yield rng.choice((
                f"{stamp} {host} INFO deploy version 2.{rng.randrange(3, 9)}.{rng.randrange(20)} started",
                f"{stamp} {host} INFO service restarted",
                f"{stamp} {host} INFO health check ok",
                f"{stamp} {host} INFO config reloaded",
            ))


class LogFeed:
    """Segments of `SEGMENT_LINES` log lines, counted in the engine's tokens."""

    def __init__(self, seed: int, count_tokens: Callable[[str], int]) -> None:
        self.lines = log_lines(random.Random(seed))
        self.count_tokens = count_tokens

    def take(self, tokens: int) -> list[tuple[str, int]]:
        """Segments (text, tokens) adding up to about `tokens` (at least one)."""
        out: list[tuple[str, int]] = []
        total = 0
        while not out or total < tokens:
            text = "\n".join(next(self.lines) for _ in range(SEGMENT_LINES)) + "\n"
            n = self.count_tokens(text)
            if out and total + n > tokens + n // 2:      # the nearest total, not always above
                break
            out.append((text, n))
            total += n
        return out


# --- one client ---------------------------------------------------------------------------------

@dataclass
class QueryResult:
    ttft_ms: float             # client: sent -> first token (a Flash hit: -> the answer)
    server_ttft_ms: float      # QueryDone.ttft_ms
    context_tokens: int
    shared_tokens: int
    data_version: int
    flash_hit: bool
    tokens_computed: int


class SessionsClient:
    """The calls the benchmark makes, over one channel to the service."""

    def __init__(self, address: str) -> None:
        import grpc

        from protos import inference_pb2, inference_pb2_grpc, sessions_pb2_grpc

        self.channel = grpc.insecure_channel(address)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.sessions = sessions_pb2_grpc.SessionsStub(self.channel)
        chat = self.inference.Describe(inference_pb2.DescribeRequest(), timeout=60).model_info.chat_format
        self.head_prefix = chat.prompt_prefix + chat.user_prefix
        self.query_suffix = chat.user_suffix + chat.assistant_prefix

    def close(self) -> None:
        self.channel.close()

    # the prompt, as sessions.proto lays it out
    def segments(self, instructions: str, data: Sequence[str], question: str) -> list[Any]:
        from inference_svc.engine.sessions import DATA_HEADER
        from protos import common_pb2

        return [common_pb2.Segment(text=self.head_prefix + instructions + DATA_HEADER),
                *(common_pb2.Segment(text=text) for text in data),
                common_pb2.Segment(text=f"Question: {question}" + self.query_suffix)]

    def query(self, session_id: str, question: str, max_tokens: int = 1) -> QueryResult:
        from protos import common_pb2, sessions_pb2

        request = sessions_pb2.QueryRequest(session_id=session_id, question=question,
                                            sampling=common_pb2.SamplingParams(max_tokens=max_tokens))
        sent = time.perf_counter()
        first = started = done = None
        for response in self.sessions.Query(request, timeout=600):
            kind = response.WhichOneof("kind")
            if kind == "token":
                first = first or time.perf_counter()
            elif kind == "started":
                started = response.started
            else:
                done = response.done
        end = time.perf_counter()
        return QueryResult(((first or end) - sent) * 1e3, done.ttft_ms, started.context_tokens, started.shared_tokens,
                           done.data_version, done.flash_hit, done.stats.tokens_computed)

    def generate(self, segments: Sequence[Any], max_tokens: int = 1) -> tuple[float, Any]:
        """Client TTFT (ms) and the InferenceDone."""
        from protos import common_pb2, inference_pb2

        request = inference_pb2.GenerateRequest(segments=list(segments),
                                                sampling=common_pb2.SamplingParams(max_tokens=max_tokens))
        sent = time.perf_counter()
        first = done = None
        for response in self.inference.Generate(request, timeout=600):
            kind = response.event.WhichOneof("kind")
            if kind == "token":
                first = first or time.perf_counter()
            elif kind == "done":
                done = response.event.done
        return ((first or time.perf_counter()) - sent) * 1e3, done

    def ingest(self, session_id: str, texts: Sequence[str]) -> Any:
        from protos import common_pb2, sessions_pb2

        batches = [texts[i:i + BATCH_SEGMENTS] for i in range(0, len(texts), BATCH_SEGMENTS)]
        return self.sessions.Ingest(iter([sessions_pb2.IngestRequest(
            session_id=session_id, segments=[common_pb2.Segment(text=t) for t in batch]) for batch in batches]),
            timeout=600)

    def describe(self, session_id: str) -> Any:
        from protos import sessions_pb2

        return self.sessions.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=session_id),
                                             timeout=60).session

    def wait_ready(self, session_id: str, timeout_s: float = 900.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.describe(session_id)
            if info.state == "ready" and info.computed_tokens == info.head_tokens + info.data_tokens:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"session {session_id} not ready after {timeout_s:.0f}s: {info}")
            time.sleep(0.01)


class FlashWatcher:
    """Subscribe on a thread: the latest flash_ready per data version."""

    def __init__(self, client: SessionsClient, session_id: str) -> None:
        from protos import sessions_pb2

        self.versions: dict[int, Any] = {}
        self.changed = threading.Condition()
        self.call = client.sessions.Subscribe(sessions_pb2.SubscribeRequest(session_id=session_id), timeout=7200)
        self.thread = threading.Thread(target=self._read, name="bench-flash-watch", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        import grpc

        try:
            for response in self.call:
                event = response.event
                if event.WhichOneof("kind") == "flash_ready":
                    with self.changed:
                        self.versions[event.flash_ready.data_version] = event.flash_ready
                        self.changed.notify_all()
        except grpc.RpcError:
            pass            # cancelled at the end

    def wait(self, version: int, timeout_s: float = 600.0) -> Any:
        with self.changed:
            if not self.changed.wait_for(lambda: version in self.versions, timeout_s):
                raise TimeoutError(f"no flash_ready for data version {version} after {timeout_s:.0f}s")
            return self.versions[version]

    def stop(self) -> None:
        self.call.cancel()
        self.thread.join(timeout=30)


# --- one seed ---------------------------------------------------------------------------------------

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


# --- vLLM baseline ----------------------------------------------------------------------------------

def _vllm_prefix_cache(args: argparse.Namespace, model_dir: Path, contexts: dict[tuple[int, int], list[str]],
                       rows: list[dict[str, Any]]) -> str | None:
    """Warm Generate through a `--backend vllm` service on each seed's contexts; adds
    `vllm_prefix_cache_ttft_ms` to `rows`. Returns why it was skipped, or None."""
    python = args.vllm_python
    if args.no_vllm:
        return "--no-vllm"
    if not python or not Path(python).exists():
        return f"no vLLM interpreter ({python or '/opt/vllm-venv/bin/python'} missing)"
    from inference_svc.vllm_backend.launch import start_vllm_service

    say(f"starting the vLLM inference service ({python})")
    try:
        service = start_vllm_service(model_dir, dtype=args.resolved_dtype, device=args.device, metrics_port=0,
                                     python=python, timeout_s=900)
    except Exception as exc:        # the baseline is optional: say why it is missing
        return f"the vLLM service did not start: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    client = SessionsClient(service.address)
    try:
        for row in rows:
            rng = random.Random(f"vllm-{row['seed']}-{row['point']}")
            data = contexts[(row["seed"], row["point"])]
            tag = f"[vllm {row['seed']}-{row['point']}-{time.time_ns()}] "
            questions = rng.sample(QUESTIONS, args.warm_repeats + 1)
            client.generate(client.segments(tag + INSTRUCTIONS, data, questions[0]))      # fills the cache
            warm = [client.generate(client.segments(tag + INSTRUCTIONS, data, q))[0] for q in questions[1:]]
            row["vllm_prefix_cache_ttft_ms"] = statistics.median(warm)
            say(f"vLLM seed {row['seed']} {row['context_tokens']:>5} tokens: prefix cache "
                 f"{row['vllm_prefix_cache_ttft_ms']:.1f} ms")
    finally:
        client.close()
        service.stop()
    return None


# --- combining, table, plot -------------------------------------------------------------------------

def combine(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per `--points` entry: each metric's median over seeds, with `_min` and `_max`."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["point"], []).append(row)
    points = []
    for _, group in sorted(grouped.items()):
        out: dict[str, Any] = {"context_tokens": round(statistics.median(r["context_tokens"] for r in group)),
                               "seeds": len(group)}
        for key in METRICS:
            values = [r[key] for r in group if r.get(key) is not None]
            if values:
                stat = spread(values)
                out[key], out[f"{key}_min"], out[f"{key}_max"] = stat["median"], stat["min"], stat["max"]
        out["session_shared_tokens"] = min(r["session_shared_tokens"] for r in group)
        out["session_context_tokens"] = max(r["session_context_tokens"] for r in group)
        points.append(out)
    return points


def ratios(points: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, each as a median over seeds of the same-seed ratio, with the spread."""
    first, last = min(r["point"] for r in rows), max(r["point"] for r in rows)
    by_seed: dict[int, dict[int, dict[str, Any]]] = {}
    for row in rows:
        by_seed.setdefault(row["seed"], {})[row["point"]] = row
    growth, vs_generate, vs_prefix, vs_vllm, flash_server = [], [], [], [], []
    for seed_rows in by_seed.values():
        small, large = seed_rows[first], seed_rows[last]
        growth.append(large["session_query_ttft_ms"] / small["session_query_ttft_ms"])
        vs_generate.append(large["generate_ttft_ms"] / large["session_query_ttft_ms"])
        vs_prefix.append(large["prefix_cache_ttft_ms"] / large["session_query_ttft_ms"])
        if large.get("vllm_prefix_cache_ttft_ms") is not None:
            vs_vllm.append(large["vllm_prefix_cache_ttft_ms"] / large["session_query_ttft_ms"])
        flash_server.extend(r["flash_hit_server_ms"] for r in seed_rows.values())
    out = {
        "session_query_growth": spread(growth),             # largest / smallest context, target <= 1.2
        "speedup_vs_generate": spread(vs_generate),         # at the largest context, target >= 5
        "speedup_vs_prefix_cache": spread(vs_prefix),       # at the largest context, target >= 2.4
        "flash_hit_server_ms_max": max(flash_server),       # every point and seed, target < 5
    }
    if vs_vllm:
        out["speedup_vs_vllm_prefix_cache"] = spread(vs_vllm)
    out["targets_met"] = {
        "session_query_growth_le_1.2": out["session_query_growth"]["median"] <= 1.2,
        "speedup_vs_generate_ge_5": out["speedup_vs_generate"]["median"] >= 5,
        "speedup_vs_prefix_cache_ge_2.4": out["speedup_vs_prefix_cache"]["median"] >= 2.4,
        "flash_hit_server_lt_5ms": out["flash_hit_server_ms_max"] < 5,
    }
    return out


def _cell(point: dict[str, Any], key: str, fmt: str = "{:.1f}") -> str:
    if point.get(key) is None:
        return "-"
    if point["seeds"] == 1:
        return fmt.format(point[key])
    return f"{fmt.format(point[key])} ({fmt.format(point[key + '_min'])}-{fmt.format(point[key + '_max'])})"


def format_table(points: Sequence[dict[str, Any]]) -> str:
    vllm = any(p.get("vllm_prefix_cache_ttft_ms") is not None for p in points)
    head = ("| context tokens | session query TTFT ms | Generate (cold) TTFT ms | prefix cache (warm) TTFT ms "
            + ("| vLLM prefix cache TTFT ms " if vllm else "")
            + "| Flash hit ms (client) | Flash hit ms (server) | vs Generate | vs prefix cache |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for p in points:
        lines.append(
            f"| {p['context_tokens']:,} | {_cell(p, 'session_query_ttft_ms')} "
            f"| {_cell(p, 'generate_ttft_ms', '{:.0f}')} | {_cell(p, 'prefix_cache_ttft_ms')} "
            + (f"| {_cell(p, 'vllm_prefix_cache_ttft_ms')} " if vllm else "")
            + f"| {_cell(p, 'flash_hit_ms', '{:.2f}')} | {_cell(p, 'flash_hit_server_ms', '{:.3f}')} "
            f"| {p['generate_ttft_ms'] / p['session_query_ttft_ms']:.1f}x "
            f"| {p['prefix_cache_ttft_ms'] / p['session_query_ttft_ms']:.1f}x |")
    lines.append("\nCells: median over seeds (min-max). The ratio columns divide the medians; the targets use "
                 "same-seed ratios (JSON `ratios`).")
    return "\n".join(lines)


def format_ingestion(ingestion: dict[str, Any]) -> str:
    lines = ["| ingestion | tokens/s | queries meanwhile | their TTFT p50 ms |", "|---|---|---|---|"]
    for name in ("without_queries", "with_queries"):
        entry = ingestion.get(name)
        if entry:
            ttft = entry.get("query_ttft_ms")
            lines.append(f"| {name.replace('_', ' ')} | {entry['tokens_per_s']['median']:.0f} "
                         f"({entry['tokens_per_s']['min']:.0f}-{entry['tokens_per_s']['max']:.0f}) "
                         f"| {entry['queries']} | {'-' if ttft is None else format(ttft['median'], '.0f')} |")
    return "\n".join(lines)


def summarize_ingestion(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Tokens/s per seed (all its ingested tokens over all its ingest time), with and without
    queries running; median and spread over seeds."""
    out = {}
    for name, flag in (("without_queries", False), ("with_queries", True)):
        per_seed: dict[int, list[dict[str, Any]]] = {}
        for run in runs:
            if run["with_queries"] is flag:
                per_seed.setdefault(run["seed"], []).append(run)
        if not per_seed:
            continue
        rates = [sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs) for rs in per_seed.values()]
        ttfts = [r["query_ttft_ms"] for rs in per_seed.values() for r in rs if r["query_ttft_ms"] is not None]
        queries = sum(r["queries"] for rs in per_seed.values() for r in rs)
        out[name] = {"tokens_per_s": spread(rates), "queries": queries,
                     "query_ttft_ms": spread(ttfts) if ttfts else None}
    return out


def write_plot(points: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = (("generate_ttft_ms", "Generate (cold prefill)", "s-"),
              ("prefix_cache_ttft_ms", "Generate, prefix cache (warm)", "^-"),
              ("vllm_prefix_cache_ttft_ms", "vLLM prefix cache (warm)", "v--"),
              ("session_query_ttft_ms", "session query", "o-"),
              ("flash_hit_ms", "Flash hit (client)", "d-"))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for key, label, style in series:
        shown = [p for p in points if p.get(key) is not None]
        if not shown:
            continue
        xs = [p["context_tokens"] for p in shown]
        ys = [p[key] for p in shown]
        err = [[p[key] - p.get(f"{key}_min", p[key]) for p in shown],
               [p.get(f"{key}_max", p[key]) - p[key] for p in shown]]
        ax.errorbar(xs, ys, yerr=err, fmt=style, capsize=3, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("context tokens (instructions + data)")
    ax.set_ylabel("time to first token, ms (log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- the command ----------------------------------------------------------------------------------------

def add_bench_sessions_args(parser: argparse.ArgumentParser) -> None:
    from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DTYPE_CHOICES

    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--points", type=positive_int_list, default=DEFAULT_POINTS,
                        help="context sizes (head + data tokens), comma-separated")
    parser.add_argument("--seeds", type=int_list, default="0,1,2", help="data and question seeds, comma-separated")
    parser.add_argument("--questions", type=int, default=5, help="session queries per point (median)")
    parser.add_argument("--warm-repeats", type=int, default=3, help="warm Generates per point (median)")
    parser.add_argument("--flash-repeats", type=int, default=5, help="Flash hits per point (median)")
    parser.add_argument("--flash-max-tokens", type=int, default=8, help="the Flash question's answer length")
    parser.add_argument("--kv-device-blocks", type=int, default=2048)
    parser.add_argument("--vllm-python", default=str(Path("/opt/vllm-venv/bin/python")),
                        help="interpreter with vllm for the vLLM baseline (skipped when missing)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM baseline")
    parser.add_argument("--json", type=Path, default=None, help="write the points and runs here")
    parser.add_argument("--plot", type=Path, default=None, help="the TTFT plot (default: beside --json, .png)")


def run_bench_sessions(args: argparse.Namespace) -> int:
    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.factory import load_tokenizer
    from inference_svc.launch import start_inference_service
    from servicekit.hardware import resolve_dtype

    points, seeds = args.points, args.seeds
    if points != sorted(set(points)):
        raise SystemExit("--points must increase")
    if args.questions < 1 or args.warm_repeats < 1 or args.flash_repeats < 1:
        raise SystemExit("--questions, --warm-repeats and --flash-repeats must be >= 1")
    model_dir = Path(args.model or prepare_embedded_model(progress=False))
    dtype = args.resolved_dtype = resolve_dtype(args.dtype, args.device)   # what the service resolves "auto" to
    tokenizer = load_tokenizer(model_dir)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    say(f"sessions bench: {dtype}, points {points}, seeds {seeds}; starting the inference service")
    # A subprocess, as every benchmark's service: hosted in this process it would share the
    # interpreter with the client (docs/concurrent/hosting.txt).
    service = start_inference_service("native", model_dir, max_streams=64, policy=None, dtype=dtype,
                                      device=args.device, extra_args=["--kv-device-blocks", str(args.kv_device_blocks)])
    client = SessionsClient(service.address)
    rows: list[dict[str, Any]] = []
    ingestion_runs: list[dict[str, Any]] = []
    contexts: dict[tuple[int, int], list[str]] = {}
    started = time.perf_counter()

    def result(vllm_note: str | None = None) -> dict[str, Any]:
        points_out = combine(rows)
        out: dict[str, Any] = {
            "points": points_out,
            "ratios": ratios(points_out, rows) if rows else None,
            "ingestion": summarize_ingestion(ingestion_runs),
            "config": {"dtype": dtype, "device": args.device, "model": model_dir.name, "points": points,
                       "seeds": seeds, "questions": args.questions, "warm_repeats": args.warm_repeats,
                       "flash_repeats": args.flash_repeats, "flash_max_tokens": args.flash_max_tokens,
                       "max_tokens": 1, "cold_generate": "unique tag at the start of the instructions",
                       "cpu_count": os.cpu_count()},
            "runs": rows, "ingestion_runs": ingestion_runs,
        }
        if vllm_note:
            out["vllm_skipped"] = vllm_note
        return out

    try:
        client.generate(client.segments(INSTRUCTIONS, ["warm-up\n"], QUESTIONS[0]))     # lazy initialisation
        for seed in seeds:
            seed_rows, seed_ingestion, seed_contexts = run_seed(client, seed, points, args, count_tokens)
            rows.extend(seed_rows)
            ingestion_runs.extend(seed_ingestion)
            contexts.update({(seed, p): c for p, c in zip(points, seed_contexts, strict=True)})
            say(f"seed {seed} done ({time.perf_counter() - started:.0f}s)")
            if args.json:       # after every seed, so an interrupted benchmark keeps what it measured
                write_json(args.json, result())
    finally:
        client.close()
        service.stop()
    vllm_note = _vllm_prefix_cache(args, model_dir, contexts, rows)
    if vllm_note:
        say(f"vLLM baseline skipped: {vllm_note}")
    out = result(vllm_note)
    print(format_table(out["points"]))
    print()
    print(format_ingestion(out["ingestion"]))
    r = out["ratios"]
    print(f"\nSame-seed ratios (median, min-max): session query largest/smallest "
          f"{r['session_query_growth']['median']:.2f}x ({r['session_query_growth']['min']:.2f}-"
          f"{r['session_query_growth']['max']:.2f}); at the largest context vs Generate "
          f"{r['speedup_vs_generate']['median']:.1f}x, vs the prefix cache "
          f"{r['speedup_vs_prefix_cache']['median']:.2f}x "
          f"({r['speedup_vs_prefix_cache']['min']:.2f}-{r['speedup_vs_prefix_cache']['max']:.2f}); "
          f"Flash hit at the service at most {r['flash_hit_server_ms_max']:.3f} ms")
    if args.json:
        write_json(args.json, out)
    plot = args.plot or (args.json.with_suffix(".png") if args.json else None)
    if plot:
        write_plot(out["points"], plot, f"Session query vs Generate TTFT ({model_dir.name}, {dtype}, "
                                        f"{len(seeds)} seeds, {os.cpu_count()} CPUs)")
        say(f"plot: {plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_sessions_args(parser)
    return run_bench_sessions(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
