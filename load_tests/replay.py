"""`streamrag bench replay`: the Stream2LLM evaluation (paper section 6) re-done on our Inference service.

    streamrag bench replay --trace traces/crawler.jsonl --qps 0.5 --qps 2 \\
        [--policies fcfs,lcas] [--eviction cost,recompute] [--kv-device-blocks N] \\
        [--delay-multiplier M] [--max-queries N] [--output-tokens 1] [--engine native,vllm] \\
        [--address HOST:PORT] --out DIR

For each engine and (policy, eviction) configuration an Inference service is started as a
subprocess, `streamrag serve inference --backend native|vllm` (the embedded model unless
`--model`; one service per configuration, stopped after it; vLLM's policy `default` is vLLM-S and
vLLM-NS); or the service at `--address` is used as it is (its policy and eviction are read with
Describe). A service in the replay client's own interpreter was slower in some bursts and not in
others (the client's gRPC loop beside the engine thread: docs/benchmarks.md, "Prefill under
concurrency"), so it never shares one.
Each workload of the trace (its records' `workload` label) is replayed on its own, at each
QPS, streaming in every configuration and non-streaming once per engine (in its first
configuration; `--baseline each` runs it in every one):

- streaming: at the query's first chunk a `StreamPrompt` is opened with the head (the
  query), then every chunk is sent at its `t_s` as an `append` (its documents) or an `update`
  (the complete document list), and `finish` (the suffix) right after the last chunk;
- non-streaming: one `Generate` with the whole final prompt (head + final documents +
  suffix) at the time the last chunk would have arrived.

Queries arrive as a Poisson process at the QPS (seeded; the same arrivals for both modes).
A document becomes one segment keyed by its id. Each request generates `--output-tokens`
tokens (1: the prefill-instance setting). TTFT is the paper's: first token minus the
arrival of the query's last chunk (its scheduled time); `ttft_from_arrival_s` counts from
the query's arrival. Every run tags its prompts with its own session number right after the
chat prefix, so the prefix cache never carries KV from one run into the next.

Writes `DIR/summary.json` (`configs`: one entry per engine, workload, policy, eviction,
streaming, QPS), `DIR/requests.jsonl` (every request), `DIR/report.md` and PNG plots
(load_tests/plots.py); progress goes to stderr. The argparse wiring (`add_bench_replay_args`,
`run_bench_replay`) imports nothing heavy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inference_svc.engine.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_EVICTION,
    DEFAULT_KV_CPU_BLOCKS,
    DEFAULT_MAX_STREAMS,
    DEFAULT_POLICY,
    DEFAULT_TOKEN_BUDGET,
    DTYPE_CHOICES,
    EVICTION_CHOICES,
    POLICY_CHOICES,
)
from inference_svc.server_args import add_speculative_args
from load_tests.cli_types import positive_float, positive_int
from load_tests.plots import write_plots
from load_tests.report import BASELINE_ONCE_KEYS, PAIR_KEYS, add_speedups, render_report, summarize_run
from retriever_svc.stability import stability_hints
from retriever_svc.trace import TraceDocument, TraceQuery, read_trace
from servicekit.progress import say

ENGINE = "native"
ENGINES = ("native", "vllm")
DEFAULT_EVICTIONS = {"native": DEFAULT_EVICTION, "vllm": "recompute"}   # without --eviction (docs/vllm.md)
START_DELAY_S = 0.2          # first arrival after the run starts (lets every task get scheduled)


# --- the prompt -------------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptBuilder:
    """Segments of a replayed prompt: head (the query), one segment per document, suffix.

    `session` is written right after the chat prefix, so two runs never share prefix-cache
    blocks beyond the chat prefix; every session string has the same length.
    """

    prompt_prefix: str = ""
    user_prefix: str = ""
    user_suffix: str = ""
    assistant_prefix: str = ""
    session: str = ""
    stability_hints: bool = True        # updates carry the retriever's hints (retriever_svc.stability)

    @classmethod
    def from_chat(cls, chat: Any, session: str, stability_hints: bool = True) -> PromptBuilder:
        return cls(chat.prompt_prefix, chat.user_prefix, chat.user_suffix, chat.assistant_prefix, session,
                   stability_hints)

    def head(self, query: str) -> list[Any]:
        from protos import common_pb2

        tag = f"[session {self.session}] " if self.session else ""
        return [common_pb2.Segment(text=f"{self.prompt_prefix}{self.user_prefix}{tag}{query}\n\n")]

    def document(self, doc: TraceDocument) -> Any:
        from protos import common_pb2

        return common_pb2.Segment(text=doc.text + "\n", key=doc.id)

    def suffix(self) -> list[Any]:
        from protos import common_pb2

        return [common_pb2.Segment(text=self.user_suffix + self.assistant_prefix)]


def final_documents(query: TraceQuery) -> list[TraceDocument]:
    """The context after every chunk: appends extend it, an update replaces it."""
    docs: list[TraceDocument] = []
    for chunk in query.chunks:
        docs = list(chunk.documents) if chunk.mode == "update" else docs + list(chunk.documents)
    return docs


def stable_query(query: TraceQuery) -> TraceQuery:
    """The query with each update's documents in the orchestrator's order (`stable_order`):
    survivors stay where they were, new documents follow. Both paths replay this same query."""
    from dataclasses import replace

    from orchestrator.documents import stable_order

    chunks, previous = [], []
    for chunk in query.chunks:
        if chunk.mode == "update":
            chunk = replace(chunk, documents=tuple(stable_order([d.id for d in previous], chunk.documents)))
            previous = list(chunk.documents)
        chunks.append(chunk)
    return replace(query, chunks=tuple(chunks))


def scale_query(query: TraceQuery, delay_multiplier: float) -> TraceQuery:
    """Stretch the gaps between a query's chunks by `delay_multiplier` (the first chunk keeps its time).

    Longer gaps keep each streamed prompt resident longer, which is how the paper creates
    memory pressure (section 6.4); the time before the first chunk holds no KV, so it stays.
    """
    if delay_multiplier == 1.0 or not query.chunks:
        return query
    from dataclasses import replace

    first = query.chunks[0].t_s
    return replace(query, chunks=tuple(replace(c, t_s=first + (c.t_s - first) * delay_multiplier)
                                       for c in query.chunks))


def poisson_arrivals(n: int, qps: float, seed: int) -> list[float]:
    """`n` arrival offsets (s) of a Poisson process at `qps`; the first at 0."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(qps)
        out.append(t)
    return out


# --- one request ------------------------------------------------------------------------------

@dataclass
class RequestRecord:
    query_id: str
    workload: str
    streaming: bool
    arrival_s: float                       # run-relative times (s)
    last_chunk_s: float                    # when the last chunk arrives (scheduled)
    chunks: int = 0
    first_token_s: float | None = None
    done_s: float | None = None
    ttft_s: float | None = None            # first token - last chunk (the paper's TTFT)
    ttft_from_arrival_s: float | None = None
    server_ttft_s: float | None = None     # the service's own ttft_from_last_chunk_s
    prompt_tokens: int = 0
    tokens_computed: int = 0
    tokens_invalidated: int = 0
    preemptions_swap: int = 0
    preemptions_recompute: int = 0
    generated_tokens: int = 0
    send_lag_s: float = 0.0                # worst lateness of a message against its schedule
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class _Clock:
    def __init__(self, t0: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.t0 = t0
        self.t0_wall = time.time() + (t0 - self.loop.time())     # the run's zero in wall time (step logs)

    def now(self) -> float:
        return self.loop.time() - self.t0

    async def until(self, t: float, record: RequestRecord) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)
        record.send_lag_s = max(record.send_lag_s, self.now() - t)


async def _read_events(call: Any, record: RequestRecord, clock: _Clock) -> None:
    import grpc

    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            break
        event = response.event
        kind = event.WhichOneof("kind")
        if kind == "token" and record.first_token_s is None:
            record.first_token_s = clock.now()
        elif kind == "done":
            record.done_s = clock.now()
            stats = event.done.stats
            record.server_ttft_s = stats.ttft_from_last_chunk_s
            record.prompt_tokens = stats.prompt_tokens
            record.tokens_computed = stats.tokens_computed
            record.tokens_invalidated = stats.tokens_invalidated
            record.preemptions_swap = stats.preemptions_swap
            record.preemptions_recompute = stats.preemptions_recompute
            record.generated_tokens = stats.generated_tokens
            if record.first_token_s is None:
                record.error = f"ended without a token: {event.done.finish_detail or event.done.finish_reason}"


def _sampling(output_tokens: int) -> Any:
    from protos import common_pb2

    return common_pb2.SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)


async def _streaming_request(stub: Any, query: TraceQuery, record: RequestRecord, clock: _Clock,
                             builder: PromptBuilder, request_id: str, output_tokens: int, timeout_s: float) -> None:
    from protos import inference_pb2

    def message(**kind: Any) -> inference_pb2.StreamPromptRequest:
        return inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(**kind))

    await clock.until(record.arrival_s + query.chunks[0].t_s, record)
    call = stub.StreamPrompt(timeout=timeout_s)
    reader = asyncio.create_task(_read_events(call, record, clock))
    try:
        await call.write(message(open=inference_pb2.PromptOpen(
            request_id=request_id, sampling=_sampling(output_tokens), segments=builder.head(query.query))))
        previous_update: list[str] | None = None
        for chunk in query.chunks:
            await clock.until(record.arrival_s + chunk.t_s, record)
            segments = [builder.document(d) for d in chunk.documents]
            if chunk.mode == "update":
                if builder.stability_hints:     # what the ANNS retriever sends with this refinement
                    ids = [d.id for d in chunk.documents]
                    for segment, hint in zip(segments, stability_hints(previous_update, ids, chunk.final), strict=True):
                        if hint is not None:
                            segment.stability = hint
                    previous_update = ids
                final = chunk.final or not builder.stability_hints
                await call.write(message(update=inference_pb2.PromptReplace(segments=segments, final_stage=final)))
            elif segments:                      # an empty append is only an end marker
                await call.write(message(append=inference_pb2.PromptAppend(segments=segments)))
        await call.write(message(finish=inference_pb2.PromptFinish(segments=builder.suffix())))
        await call.done_writing()
    except Exception:
        await reader                            # the server ended the call: its status says why
        raise
    await reader


async def _generate_request(stub: Any, query: TraceQuery, record: RequestRecord, clock: _Clock,
                            builder: PromptBuilder, request_id: str, output_tokens: int, timeout_s: float) -> None:
    from protos import inference_pb2

    await clock.until(record.last_chunk_s, record)
    segments = builder.head(query.query) + [builder.document(d) for d in final_documents(query)] + builder.suffix()
    call = stub.Generate(inference_pb2.GenerateRequest(request_id=request_id, segments=segments,
                                                       sampling=_sampling(output_tokens)), timeout=timeout_s)
    await _read_events(call, record, clock)


async def _one(stub: Any, query: TraceQuery, record: RequestRecord, clock: _Clock, builder: PromptBuilder,
               request_id: str, output_tokens: int, timeout_s: float) -> None:
    import grpc

    send = _streaming_request if record.streaming else _generate_request
    try:
        await send(stub, query, record, clock, builder, request_id, output_tokens, timeout_s)
    except grpc.aio.AioRpcError as exc:
        record.error = f"{exc.code().name}: {exc.details()}"
    except Exception as exc:                   # one bad request must not end the run
        record.error = f"{type(exc).__name__}: {exc}"
    if record.error is None and record.first_token_s is None:
        record.error = "no token received"
    if record.first_token_s is not None:
        record.ttft_s = record.first_token_s - record.last_chunk_s
        record.ttft_from_arrival_s = record.first_token_s - record.arrival_s


@dataclass
class RunResult:
    streaming: bool
    qps: float
    records: list[RequestRecord] = field(default_factory=list)
    trace_completion_s: float = 0.0
    start_wall_s: float = 0.0           # the run's zero (arrival_s 0) in wall time (time.time())


async def replay_run(stub: Any, queries: Sequence[TraceQuery], *, streaming: bool, qps: float, seed: int,
                     builder: PromptBuilder, output_tokens: int = 1, timeout_s: float = 600.0,
                     label: str = "", progress: Callable[[str], None] | None = None) -> RunResult:
    """Replay `queries` once (streaming or not) with Poisson arrivals; every query is its own task."""
    arrivals = poisson_arrivals(len(queries), qps, seed)
    clock = _Clock(asyncio.get_running_loop().time() + START_DELAY_S)
    mode = "s" if streaming else "ns"
    records = [RequestRecord(q.query_id, q.workload, streaming, a, a + q.duration_s, len(q.chunks))
               for q, a in zip(queries, arrivals, strict=True)]
    done = 0
    step = max(1, len(queries) // 10)

    async def task(query: TraceQuery, record: RequestRecord) -> None:
        nonlocal done
        await _one(stub, query, record, clock, builder, f"{builder.session}-{mode}-{query.query_id}",
                   output_tokens, timeout_s)
        done += 1
        if progress and (done % step == 0 or done == len(queries)):
            progress(f"{label}: {done}/{len(queries)} requests done at t={clock.now():.1f}s")

    await asyncio.gather(*(task(q, r) for q, r in zip(queries, records, strict=True)))
    ends = [r.done_s if r.done_s is not None else r.first_token_s for r in records]
    completion = max((e for e in ends if e is not None), default=math.nan)
    return RunResult(streaming, qps, records, completion, clock.t0_wall)


# --- the service ------------------------------------------------------------------------------

def service_flags(args: argparse.Namespace, engine: str, eviction: str) -> list[str]:
    """`streamrag serve inference` flags for this run's engine settings (the policy is passed apart)."""
    flags = ["--token-budget", str(args.token_budget), "--eviction", eviction]
    if args.kv_device_blocks:
        flags += ["--kv-device-blocks", str(args.kv_device_blocks)]
    if engine == "native":
        share = "off" if args.speculative_share is None else str(args.speculative_share)
        flags += ["--kv-cpu-blocks", str(args.kv_cpu_blocks), "--speculative-share", share,
                  "--speculative-reserve-share", str(args.speculative_reserve_share),
                  "--speculative-append-share", str(args.speculative_append_share)]
    return flags


def _bench_service(args: argparse.Namespace, engine: str, policy: str, eviction: str,
                   workloads: dict[str, list[TraceQuery]], session: Callable[[], str], say: Callable[[str], None],
                   configs: list[dict[str, Any]], rows: list[dict[str, Any]], requests_out: Any,
                   modes: Sequence[bool]) -> None:
    """One configuration on a `streamrag serve inference --backend ENGINE` subprocess: its own process,
    as in production, so the replay client never shares the service's interpreter. `vllm` runs with
    `--vllm-python` (an interpreter with the vllm extra, docs/vllm.md): policy `default` is vLLM's own
    scheduler (streaming: vLLM-S; Generate: vLLM-NS), the others our policy in vLLM (scheduler.py)."""
    from inference_svc.launch import start_inference_service

    python = args.vllm_python if engine == "vllm" else sys.executable
    say(f"starting the {engine} inference service ({python}): policy {policy}, eviction {eviction}")
    service = start_inference_service(engine, args.model, max_streams=args.max_streams, policy=policy,
                                      dtype=args.dtype, device=args.device,
                                      extra_args=service_flags(args, engine, eviction), metrics_port=0,
                                      python=python)
    say(f"{engine} service log: {service.log_path}")
    try:
        asyncio.run(_bench_on(service.address, workloads, args, session, say, configs, rows, requests_out, modes))
    finally:
        service.stop()


def _check_vllm_supports(policies: Sequence[str], evictions: Sequence[str]) -> None:
    """Fail before any run when `--engine vllm` cannot honour a listed policy or eviction mode."""
    from inference_svc.vllm_backend.config import UnsupportedConfiguration, check_supported

    try:
        for policy in policies:
            for eviction in evictions:
                check_supported(policy, eviction)
    except UnsupportedConfiguration as exc:
        raise ValueError(f"--engine vllm: {exc}") from None


def _default_vllm_python() -> str:
    """$STREAMRAG_VLLM_PYTHON, else the venv docs/vllm.md installs, else this interpreter."""
    venv = Path("/opt/vllm-venv/bin/python")
    return os.environ.get("STREAMRAG_VLLM_PYTHON") or (str(venv) if venv.exists() else sys.executable)


# --- the benchmark ----------------------------------------------------------------------------

def _split_list(text: str, allowed: Sequence[str], flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if not items or bad:
        raise ValueError(f"{flag}: expected a comma-separated list of {', '.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(items))


def update_workloads(queries: Sequence[TraceQuery]) -> set[str]:
    """Workloads with at least one `update` chunk (their tokens-invalidated CCDF is plotted)."""
    return {q.workload for q in queries if any(c.mode == "update" for c in q.chunks)}


def workloads_of(queries: Sequence[TraceQuery]) -> dict[str, list[TraceQuery]]:
    out: dict[str, list[TraceQuery]] = {}
    for q in queries:
        out.setdefault(q.workload, []).append(q)
    return out


ENGINE_COUNTERS = ("prompt_tokens_computed", "prefix_cache_hit_tokens", "generated_tokens", "tokens_invalidated",
                   "preemptions_recompute", "preemptions_swap", "steps")


async def _engine_counters(stub: Any) -> dict[str, int]:
    """The service's engine-wide counters (`GetStats`). On the native engine `prompt_tokens_computed`
    is every prompt token prefilled; on vLLM it is what vLLM's iteration stats count, a request's
    first prefill only (the later turns of a streaming session are not in it), so there it measures
    resubmissions (an update's, an evicted session's) and Generate, not streaming turns (docs/vllm.md)."""
    from protos import inference_pb2

    counters = (await stub.GetStats(inference_pb2.GetStatsRequest(), timeout=60)).stats.counters
    return {name: getattr(counters, name) for name in ENGINE_COUNTERS}


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What one configuration's replay added to the engine's counters."""
    return {name: after[name] - before[name] for name in ENGINE_COUNTERS}


async def _bench_on(address: str, workloads: dict[str, list[TraceQuery]], args: argparse.Namespace,
                    session: Callable[[], str], say: Callable[[str], None],
                    configs: list[dict[str, Any]], rows: list[dict[str, Any]], requests_out: Any,
                    modes: Sequence[bool] = (True, False)) -> None:
    """Replay every workload at every QPS on the service at `address`, in each mode of `modes`
    (True: streaming), appending summary entries to `configs` and request rows to `rows`."""
    import grpc

    from protos import inference_pb2, inference_pb2_grpc

    async with grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20),
                                                           ("grpc.max_send_message_length", 64 << 20)]) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        info = (await stub.Describe(inference_pb2.DescribeRequest(), timeout=60)).model_info
        for workload, queries in workloads.items():
            for qps in args.qps:
                for streaming in modes:
                    builder = PromptBuilder.from_chat(info.chat_format, session(), args.stability_hints == "on")
                    label = (f"[{workload} {info.policy}/{info.eviction_mode} qps={qps:g} "
                             f"{'streaming' if streaming else 'non-streaming'}]")
                    say(f"{label} replaying {len(queries)} queries")
                    started = time.monotonic()
                    counters_before = await _engine_counters(stub)
                    run = await replay_run(stub, queries, streaming=streaming, qps=qps, seed=args.seed,
                                           builder=builder, output_tokens=args.output_tokens,
                                           timeout_s=args.request_timeout, label=label, progress=say)
                    meta = {"engine": info.backend or ENGINE, "workload": workload, "policy": info.policy,
                            "eviction": info.eviction_mode, "streaming": streaming, "qps": qps,
                            "model": info.model, "dtype": info.dtype, "output_tokens": args.output_tokens,
                            "delay_multiplier": args.delay_multiplier, "kv_device_blocks": args.kv_device_blocks,
                            "start_wall_s": round(run.start_wall_s, 4)}
                    records = [r.as_json() for r in run.records]
                    for r in records:
                        row = {**{k: meta[k] for k in ("engine", "policy", "eviction", "qps")}, **r}
                        rows.append(row)
                        requests_out.write(json.dumps(row) + "\n")
                    requests_out.flush()
                    entry = summarize_run(meta, records, run.trace_completion_s)
                    entry["engine_counters"] = counter_delta(counters_before, await _engine_counters(stub))
                    configs.append(entry)
                    say(f"{label} done in {time.monotonic() - started:.1f}s: {entry['requests']} ok, "
                        f"{entry['failed']} failed, TTFT p50 {entry['ttft_s']['p50']:.3f}s "
                        f"p99 {entry['ttft_s']['p99']:.3f}s, completion {entry['trace_completion_s']:.1f}s")


def run_benchmark(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:

    trace = read_trace(args.trace)
    queries = [scale_query(q, args.delay_multiplier) for q in trace.queries]
    if args.doc_order == "stable":
        queries = [stable_query(q) for q in queries]
    workloads = workloads_of(queries)
    if args.max_queries:
        workloads = {w: qs[:args.max_queries] for w, qs in workloads.items()}
    salt = os.urandom(2).hex()
    counter = iter(range(1, 1_000_000))

    def session() -> str:
        return f"{salt}-{next(counter):04d}"

    configs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "requests.jsonl").open("w", encoding="utf-8") as requests_out:
        if args.address:
            asyncio.run(_bench_on(args.address, workloads, args, session, say, configs, rows, requests_out))
        else:
            policies = _split_list(args.policies, POLICY_CHOICES, "--policies")
            engines = _split_list(args.engine, ENGINES, "--engine")
            evictions_of = {engine: _split_list(args.eviction or DEFAULT_EVICTIONS[engine], EVICTION_CHOICES,
                                                "--eviction") for engine in engines}
            if "vllm" in engines:
                _check_vllm_supports(policies, evictions_of["vllm"])
            for engine in engines:
                evictions = evictions_of[engine]
                pairs = [(policy, eviction) for policy in policies for eviction in evictions]
                for i, (policy, eviction) in enumerate(pairs):
                    # The non-streaming baseline runs once, in the first configuration: a whole prompt
                    # sent at once leaves nothing for the policy or eviction mode to decide.
                    modes = (True, False) if i == 0 or args.baseline == "each" else (True,)
                    say(f"{engine}: {len(pairs) - i} configuration(s) to go")
                    _bench_service(args, engine, policy, eviction, workloads, session, say, configs, rows,
                                   requests_out, modes)
    add_speedups(configs, pair_keys=PAIR_KEYS if args.baseline == "each" else BASELINE_ONCE_KEYS)
    plots = write_plots(rows, args.out, update_workloads=update_workloads(queries))
    say("plots: " + ", ".join(p.name for p in plots))
    return {
        "meta": {"trace": str(args.trace), "qps": list(args.qps), "seed": args.seed,
                 "queries": {w: len(qs) for w, qs in workloads.items()}, "output_tokens": args.output_tokens,
                 "delay_multiplier": args.delay_multiplier, "kv_device_blocks": args.kv_device_blocks,
                 "token_budget": args.token_budget, "baseline": args.baseline, "engines": args.engine,
                 "address": args.address or "subprocess", "created_unix": int(time.time())},
        "plots": [p.name for p in plots],
        "configs": configs,
    }


def write_outputs(summary: dict[str, Any], out: Path) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False, default=_json_default) + "\n")
    (out / "report.md").write_text(render_report(summary))


def _json_default(value: Any) -> Any:
    raise TypeError(f"not JSON serializable: {value!r}")


def _finite(obj: Any) -> Any:
    """NaN/inf (no requests) as null, so summary.json is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# --- CLI --------------------------------------------------------------------------------------

def add_bench_replay_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag bench replay`."""
    parser.add_argument("--trace", type=Path, required=True, help="trace file (docs/trace-format.md)")
    parser.add_argument("--qps", type=positive_float, action="append", required=True,
                        help="query arrival rate (Poisson); repeat for several loads")
    parser.add_argument("--engine", default="native",
                        help="comma-separated engines: native (ours) and/or vllm (a --backend vllm service; "
                             "policy default = vLLM's own scheduler, i.e. vLLM-S / vLLM-NS; docs/vllm.md), "
                             "each over every policy x eviction")
    parser.add_argument("--vllm-python", default=_default_vllm_python(),
                        help="interpreter with the vllm extra for --engine vllm "
                             "(default: $STREAMRAG_VLLM_PYTHON, else /opt/vllm-venv if present)")
    parser.add_argument("--policies", default=DEFAULT_POLICY,
                        help=f"comma-separated scheduling policies (default: {DEFAULT_POLICY})")
    parser.add_argument("--eviction", default=None,
                        help=f"comma-separated eviction modes (default: {DEFAULT_EVICTION} on native, recompute on "
                             "vllm, the only mode vLLM honours)")
    parser.add_argument("--kv-device-blocks", type=positive_int, default=None,
                        help="device KV pool size in blocks (small: memory pressure)")
    parser.add_argument("--kv-cpu-blocks", type=int, default=DEFAULT_KV_CPU_BLOCKS,
                        help="CPU (swap) KV pool size in blocks")
    parser.add_argument("--token-budget", type=positive_int, default=DEFAULT_TOKEN_BUDGET,
                        help="tokens per engine step")
    add_speculative_args(parser)
    parser.add_argument("--stability-hints", choices=["on", "off"], default="on",
                        help="update-mode chunks carry the ANNS retriever's stability hints (on) or are all "
                             "treated as final (off: every update prefilled in full at once)")
    parser.add_argument("--doc-order", choices=["stable", "ranked"], default="stable",
                        help="update-mode document order: stable (the orchestrator's: survivors stay in place, "
                             "new documents follow) or ranked (each update in the retriever's rank order)")
    parser.add_argument("--delay-multiplier", type=positive_float, default=1.0,
                        help="stretch the gaps between a query's chunks (longer residency: memory pressure)")
    parser.add_argument("--baseline", choices=["once", "each"], default="once",
                        help="run the non-streaming baseline once per engine (in the first configuration) "
                             "or in every configuration")
    parser.add_argument("--max-queries", type=positive_int, default=None, help="first N queries of each workload")
    parser.add_argument("--output-tokens", type=positive_int, default=1,
                        help="tokens generated per request (1: prefill instance)")
    parser.add_argument("--seed", type=int, default=0, help="Poisson arrivals seed")
    parser.add_argument("--address", default=None,
                        help="use the Inference service here instead of starting one per configuration")
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--device", default=DEFAULT_DEVICE, help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--max-streams", type=positive_int, default=DEFAULT_MAX_STREAMS,
                        help="the service's concurrent streams")
    parser.add_argument("--request-timeout", type=positive_float, default=600.0, help="deadline per request (s)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")



def run_bench_replay(args: argparse.Namespace) -> int:
    try:
        summary = _finite(run_benchmark(args, say))
    except (ValueError, OSError, RuntimeError) as exc:       # RuntimeError: a vLLM service that did not start
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_outputs(summary, args.out)
    print(render_report(summary))
    print(f"wrote {args.out / 'summary.json'}, {args.out / 'report.md'}, {args.out / 'requests.jsonl'}")
    failed = sum(c.get("failed", 0) for c in summary["configs"])
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrag bench replay", description=__doc__.split("\n\n")[0])
    add_bench_replay_args(parser)
    return run_bench_replay(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
