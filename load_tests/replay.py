"""`streamrag bench replay`: the Stream2LLM evaluation (paper section 6) re-done on our Inference service.

    streamrag bench replay --trace traces/crawler.jsonl --qps 0.5 --qps 2 \\
        [--policies fcfs,lcas] [--eviction cost,recompute] [--kv-device-blocks N] \\
        [--delay-multiplier M] [--max-queries N] [--output-tokens 1] [--engine native,vllm] \\
        [--address HOST:PORT] [--seeds 0,1,2] --out DIR

For each engine and (policy, eviction) configuration an Inference service is started as a
subprocess, `streamrag serve inference --backend native|vllm` (the embedded model unless
`--model`; one service per configuration, stopped after it; vLLM's policy `default` is vLLM-S and
vLLM-NS); or the service at `--address` is used as it is (its policy and eviction are read with
Describe). A service in the replay client's own interpreter was slower in some bursts and not in
others (the client's gRPC loop beside the engine thread: docs/results.md, "Ours against
vLLM"), so it never shares one.
Each workload of the trace (its records' `workload` label) is replayed on its own, at each
QPS, streaming in every configuration and non-streaming once per engine (in its first
configuration; `--baseline each` runs it in every one); one run's prompts and requests are
`load_tests.replay_run`. Each request generates `--output-tokens` tokens (1: the
prefill-instance setting); `ttft_from_arrival_s` counts from the query's arrival. Every run
tags its prompts with its own session number right after the chat prefix, so the prefix cache
never carries KV from one run into the next.

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
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from inference_svc.engine.options import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_EVICTION,
    DEFAULT_KV_CPU_BLOCKS,
    DEFAULT_POLICY,
    DEFAULT_TOKEN_BUDGET,
    DTYPE_CHOICES,
    EVICTION_CHOICES,
    POLICY_CHOICES,
)
from inference_svc.options import DEFAULT_MAX_STREAMS
from inference_svc.server_args import add_speculative_args
from load_tests import replay_seeds
from load_tests.plots import write_plots
from load_tests.replay_run import PromptBuilder, replay_run, scale_query, stable_query
from load_tests.report import BASELINE_ONCE_KEYS, PAIR_KEYS, add_speedups, render_report, summarize_run
from load_tests.runner import add_seeds_arg, positive_float, positive_int, write_json
from retriever_svc.replay.trace import TraceQuery, read_trace
from servicekit.progress import say

ENGINE = "native"
ENGINES = ("native", "vllm")
DEFAULT_EVICTIONS = {"native": DEFAULT_EVICTION, "vllm": "recompute"}   # without --eviction (docs/vllm.md)


# --- the service ------------------------------------------------------------------------------

def service_flags(args: argparse.Namespace, engine: str, eviction: str) -> list[str]:
    """`streamrag serve inference` flags for this run's engine settings (the policy is passed apart)."""
    flags = ["--token-budget", str(args.token_budget), "--eviction", eviction]
    if args.kv_device_blocks:
        flags += ["--kv-device-blocks", str(args.kv_device_blocks)]
        if engine == "native":   # a small pool serves sequences it holds (the start-up check, rpc.limits)
            flags += ["--max-model-len", str(args.kv_device_blocks * DEFAULT_BLOCK_SIZE)]
    if engine == "vllm" and args.vllm_block_size:
        flags += ["--block-size", str(args.vllm_block_size)]
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
                            "block_size": info.block_size, "start_wall_s": round(run.start_wall_s, 4)}
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
    write_json(out / "summary.json", summary, allow_nan=False, default=_json_default)
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
    parser.add_argument("--vllm-block-size", type=positive_int, default=None,
                        help="KV block size of the vLLM service (default: the backend's, 32 tokens on CPU; a small "
                             "--kv-device-blocks pool needs larger blocks to hold one context: docs/vllm.md)")
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
    add_seeds_arg(parser, default="0", what="Poisson-arrival seeds (several: DIR/seed-S each, combined in "
                                            "DIR/seeds.json and seeds.md)")
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
    """Every seed of `--seeds` in turn (one seed: DIR itself; several: DIR/seed-S each), then, for
    several, their median and spread (`DIR/seeds.json`, `DIR/seeds.md`) and the ratios between
    configurations (load_tests/replay_seeds.py)."""
    runs, failed = [], 0
    for seed in args.seeds:
        one = argparse.Namespace(**vars(args), seed=seed)
        if len(args.seeds) > 1:
            one.out = args.out / f"seed-{seed}"
        try:
            summary = _finite(run_benchmark(one, say))
        except (ValueError, OSError, RuntimeError) as exc:   # RuntimeError: a vLLM service that did not start
            print(f"error: {exc}", file=sys.stderr)
            return 1
        write_outputs(summary, one.out)
        print(render_report(summary))
        print(f"wrote {one.out / 'summary.json'}, {one.out / 'report.md'}, {one.out / 'requests.jsonl'}")
        failed += sum(c.get("failed", 0) for c in summary["configs"])
        runs.append(summary["configs"])
    if len(runs) > 1:
        rows = replay_seeds.combine(runs)
        table = replay_seeds.render(rows, label=str(args.out))
        write_json(args.out / "seeds.json", {"seeds": args.seeds, "rows": rows})
        (args.out / "seeds.md").write_text(table + "\n", encoding="utf-8")
        print(table)
    print("\n".join(replay_seeds.peer_ratios(runs)))
    return 1 if failed else 0
