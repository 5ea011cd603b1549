"""`streamrag bench gpu-replay`: the Stream2LLM replay at the paper's own scale, in-process on one GPU.

The crawler and ANNS traces at the paper's token counts and timing (token scale 1, time scale 1),
replayed in real time through one in-process `Engine` (Llama-3.1-8B shape, random weights, bf16; one
output token; policy fcfs; token budget 8,192 per step; block size 16), streaming against not
streaming, at the paper's headline load points: crawler 4 QPS, ANNS 1 QPS.

- streaming: the request is opened with the head at the query's first chunk, every chunk is applied
  when it arrives (an `append` of its documents, or an `update` with the complete list and the
  retriever's stability hints), and `finish` with the suffix follows the last chunk: what `bench
  replay` sends (replay_run.py);
- not streaming: the whole prompt (head, final documents, suffix) is opened and finished when the
  last chunk arrives.

Prompts are random token ids of each document's token count (speed does not depend on values); a
document keeps its ids across an ANNS query's stages, so an update keeps KV up to the token LCP.
Arrivals are Poisson at the QPS (replay_run.poisson_arrivals, seeded; the same for both modes). One
loop applies every input at its time and steps the engine while it has work: the engine's own
serialization, as in the service. TTFT is reported twice: from the last chunk's arrival (the paper's
metric, the one its ratios are of) and from the query's arrival.

The traces travel as compact token traces (`load_tests/traces/paper/*.jsonl`: per document its id
and token count, updates already in the orchestrator's stable order), written on a CPU by
`--make-traces` from `streamrag trace synth` at token scale 1 and time scale 1. `--device cpu
--small` is the dry run: the tiny shape in fp32, the traces' tokens x0.02 and times x0.1 (QPS x10),
a few queries.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from load_tests.runner import positive_float, positive_int, write_json
from load_tests.token_traces import (
    TokenQuery,
    TokenTrace,
    read_token_trace,
    token_trace_of,
    write_token_trace,
)
from servicekit.stats import percentile

TRACE_DIR = Path(__file__).resolve().parent / "traces" / "paper"
QPS = {"crawler": 4.0, "anns": 1.0}           # the paper's headline load points
DEFAULT_QUERIES = {"crawler": 30, "anns": 25}   # with seed 0 the last chunk arrives at 34.1 s and 34.6 s
RATIO_AT = {"crawler": "p50", "anns": "p95"}  # the percentile the paper's headline ratio is at
TOKEN_BUDGET, BLOCK = 8192, 16
HEAD_TOKENS, SUFFIX_TOKENS = 48, 8            # chat prefix and question; end of turn and assistant prefix
START_DELAY_S = 0.2
SYNTH = {"queries": 40, "seed": 1, "max_prompt_tokens": 120_000}   # --make-traces
PAPER = {
    "source": "Stream2LLM: Llama-3.1-8B on H100/H200, tensor parallel 2, token budget 8,192, fcfs; "
              "TTFT from the last chunk, not streaming over streaming",
    "crawler_p50_ratio": [10.8, 11.0], "anns_p95_ratio": [2.49, 2.63],
}


# --- the paper-scale traces --------------------------------------------------------------

def make_traces(out_dir: Path, passages: Path | None, tokenizer: str, say: Callable[[str], None]) -> int:
    """Synthesize both workloads at paper scale (`streamrag trace synth`) and write them as token traces."""
    import tempfile

    from load_tests.paper import _run, write_passages
    from load_tests.synth.tokens import ApproxTokenCounter, EmbeddedTokenCounter
    from load_tests.trace_synth import add_trace_synth_args, run_trace_synth
    from retriever_svc.replay.trace import read_trace

    with tempfile.TemporaryDirectory() as tmp:
        if passages is None:
            passages = Path(tmp) / "passages.sqlite"
            write_passages(passages)
        counter = EmbeddedTokenCounter.load() if tokenizer == "embedded" else ApproxTokenCounter()
        for workload in QPS:
            full = Path(tmp) / f"{workload}.jsonl"
            argv = ["--workload", workload, "--queries", str(SYNTH["queries"]), "--token-scale", "1",
                    "--time-scale", "1", "--max-prompt-tokens", str(SYNTH["max_prompt_tokens"]),
                    "--seed", str(SYNTH["seed"]), "--tokenizer", tokenizer, "--passages", str(passages),
                    "--out", str(full)]
            if _run(add_trace_synth_args, run_trace_synth, argv, "streamrag trace synth"):
                return 1
            trace = read_trace(full)
            meta = {key: value for key, value in (trace.header.meta if trace.header else {}).items()
                    if key not in ("passages", "calibration")}
            meta["command"] = "streamrag trace synth " + " ".join(a for a in argv if not a.startswith(tmp))
            meta["prompt"] = f"head {HEAD_TOKENS} and suffix {SUFFIX_TOKENS} tokens are added by the replay"
            token_trace = token_trace_of(trace.queries, counter.count, workload, meta)
            write_token_trace(out_dir / f"{workload}.jsonl", token_trace)
            say(f"wrote {out_dir / f'{workload}.jsonl'}: {token_trace.statistics()}")
    return 0


# --- one replay -----------------------------------------------------------------------------

@dataclass
class Record:
    query_id: str
    arrival_s: float
    last_chunk_s: float
    prompt_tokens: int
    first_token_s: float | None = None
    tokens_computed: int = 0
    tokens_invalidated: int = 0
    preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.last_chunk_s

    @property
    def ttft_from_arrival_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


class QueryTokens:
    """A query's random token ids: the head, the suffix, and each document's (the same at every stage)."""

    def __init__(self, query: TokenQuery, vocab: int, seed: int) -> None:
        import random

        rng = random.Random(f"gpu-replay:{seed}:{query.query_id}")
        population = range(3, vocab)

        def draw(n: int) -> tuple[int, ...]:
            return tuple(rng.choices(population, k=n))

        self.head, self.suffix = draw(HEAD_TOKENS), draw(SUFFIX_TOKENS)
        self.docs: dict[str, tuple[int, ...]] = {}
        for chunk in query.chunks:
            for doc, n in chunk.docs:
                if doc not in self.docs:
                    self.docs[doc] = draw(n)


def replay(engine: Any, queries: Sequence[TokenQuery], tokens: Sequence[QueryTokens], arrivals: Sequence[float], *,
           streaming: bool, seconds: float, say: Callable[[str], None], label: str) -> tuple[list[Record], float]:
    """Replay ``queries`` once in real time; returns every query's record and the run's seconds."""
    from inference_svc.engine.events import EventKind
    from inference_svc.engine.request import Segment
    from inference_svc.engine.sampler import SamplingParams
    from retriever_svc.stability import stability_hints

    params = SamplingParams(max_tokens=1, ignore_eos=True)
    records = [Record(q.query_id, a, a + q.duration_s, HEAD_TOKENS + q.tokens + SUFFIX_TOKENS)
               for q, a in zip(queries, arrivals, strict=True)]
    inputs: list[tuple[float, int, int]] = []      # (time, query, chunk: -1 opens the stream)
    for i, (q, a) in enumerate(zip(queries, arrivals, strict=True)):
        if streaming:
            inputs += [(a + q.chunks[0].t_s, i, -1)] + [(a + c.t_s, i, j) for j, c in enumerate(q.chunks)]
        else:
            inputs.append((a + q.duration_s, i, len(q.chunks)))
    inputs.sort()
    previous_update: dict[int, list[str]] = {}

    def docs(i: int, listed: Sequence[tuple[str, int]], hints: Sequence[float | None] | None = None) -> list:
        hints = hints or [None] * len(listed)
        return [Segment(token_ids=tokens[i].docs[d], key=d, stability=h) for (d, _), h in zip(listed, hints,
                                                                                            strict=True)]

    def apply(i: int, j: int) -> None:
        q, rid, t = queries[i], f"{label}-{queries[i].query_id}", tokens[i]
        if j == -1:
            engine.open(rid, [Segment(token_ids=t.head)], params)
            return
        if j == len(q.chunks):                   # not streaming: the whole prompt at the last chunk
            engine.open(rid, [Segment(token_ids=t.head), *docs(i, q.final_docs())], params)
            engine.finish(rid, [Segment(token_ids=t.suffix)])
            return
        chunk, final = q.chunks[j], j == len(q.chunks) - 1
        if chunk.mode == "update":
            ids = [d for d, _ in chunk.docs]
            engine.update(rid, docs(i, chunk.docs, stability_hints(previous_update.get(i), ids, final)), final=final)
            previous_update[i] = ids
        elif chunk.docs:                         # an empty append is only an end marker
            engine.append(rid, docs(i, chunk.docs))
        if final:
            engine.finish(rid, [Segment(token_ids=t.suffix)])

    by_id = {f"{label}-{q.query_id}": r for q, r in zip(queries, records, strict=True)}
    t0 = time.perf_counter() + START_DELAY_S
    clock = lambda: time.perf_counter() - t0   # noqa: E731
    k, done, every = 0, 0, max(1, len(queries) // 5)
    while True:
        now = clock()
        while k < len(inputs) and inputs[k][0] <= now:
            apply(inputs[k][1], inputs[k][2])
            k += 1
        if engine.has_work():
            events = engine.step()
            stamp = clock()
            for event in events:
                record = by_id[event.request_id]
                if event.kind is EventKind.TOKEN and record.first_token_s is None:
                    record.first_token_s = stamp
                elif event.kind is EventKind.FINISHED:
                    stats = engine.release(event.request_id).stats
                    record.tokens_computed, record.tokens_invalidated = stats.tokens_computed, stats.tokens_invalidated
                    record.preemptions = stats.preemptions_swap + stats.preemptions_recompute
                    done += 1
                    if done % every == 0 or done == len(queries):
                        say(f"{label}: {done}/{len(queries)} first tokens by t={stamp:.1f} s")
        elif k < len(inputs):
            time.sleep(max(0.0, min(inputs[k][0] - clock(), 0.002)))
        if done == len(queries) or (k == len(inputs) and not engine.has_unfinished()):
            break
        if clock() > seconds:
            say(f"{label}: stopped at the {seconds:.0f} s cap with {len(queries) - done} queries unanswered")
            break
    return records, clock()


def summarize(records: Sequence[Record], seconds: float, counters: Any) -> dict[str, Any]:
    ttft = [r.ttft_s for r in records if r.ttft_s is not None]
    arrival = [r.ttft_from_arrival_s for r in records if r.ttft_from_arrival_s is not None]

    def r3(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    def p(values: list[float], q: float) -> float | None:   # None, not NaN, when nothing was answered
        return r3(percentile(values, q)) if values else None

    return {"queries": len(records), "answered": len(ttft),
            "ttft_p50_s": p(ttft, 50), "ttft_p95_s": p(ttft, 95),
            "ttft_from_arrival_p50_s": p(arrival, 50), "ttft_from_arrival_p95_s": p(arrival, 95),
            "run_s": round(seconds, 2), "steps": counters.steps,
            "prompt_tokens_computed": counters.prompt_tokens_computed,
            "tokens_invalidated": counters.tokens_invalidated,
            "preemptions": counters.preemptions_swap + counters.preemptions_recompute,
            "records": [{"query_id": r.query_id, "arrival_s": round(r.arrival_s, 4),
                         "last_chunk_s": round(r.last_chunk_s, 4), "prompt_tokens": r.prompt_tokens,
                         "ttft_s": r3(r.ttft_s), "ttft_from_arrival_s": r3(r.ttft_from_arrival_s),
                         "tokens_computed": r.tokens_computed, "tokens_invalidated": r.tokens_invalidated,
                         "preemptions": r.preemptions} for r in records]}


def ratio(not_streaming: float | None, streaming: float | None) -> float | None:
    if not not_streaming or not streaming:
        return None
    return round(not_streaming / streaming, 3)


# --- the command ----------------------------------------------------------------------------

def add_bench_gpu_replay_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", help="cuda[:N], or cpu for the dry run (with --small)")
    parser.add_argument("--small", action="store_true",
                        help="the CPU dry run: tiny shape in fp32, tokens x0.02, times x0.1 (QPS x10), 4 queries")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--trace-dir", type=Path, default=TRACE_DIR,
                        help=f"the token traces crawler.jsonl and anns.jsonl (default: {TRACE_DIR})")
    parser.add_argument("--max-queries", type=positive_int, default=None,
                        help="queries per trace, the first N (default: 30 crawler, 25 ANNS: their arrivals and "
                             "retrieval end by about 35 s; 4 with --small)")
    parser.add_argument("--seconds", type=positive_float, default=None,
                        help="cap on each run's length in seconds, queries left unanswered are reported "
                             "(default: 45; 20 with --small)")
    parser.add_argument("--total-seconds", type=positive_float, default=None,
                        help="cap on the whole command from its start: each run gets at most an equal share of "
                             "what is left (default: 215, inside scripts/gpu_replay.sh's 240; none with --small)")
    parser.add_argument("--workloads", default="crawler,anns", help="comma-separated: crawler, anns")
    parser.add_argument("--seed", type=int, default=0, help="Poisson-arrival and token-id seed (default 0)")
    parser.add_argument("--kv-gib", type=positive_float, default=None,
                        help="KV pool size (default: what the runs' prompts need, within free memory less 16 GiB)")
    parser.add_argument("--make-traces", action="store_true",
                        help="instead of replaying: synthesize both traces at paper scale (streamrag trace synth, "
                             "token and time scale 1) into --trace-dir as token traces")
    parser.add_argument("--passages", type=Path, default=None,
                        help="--make-traces: the passage store to draw documents from (default: the Python "
                             "docs split into passages, written to a temporary file)")
    parser.add_argument("--tokenizer", choices=("embedded", "approx"), default="approx",
                        help="--make-traces: count tokens with the embedded model's tokenizer or the calibrated "
                             "approximation (default)")


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.small:
        return dict(shape="tiny", dtype=torch.float32, token_scale=0.02, time_scale=0.1,
                    queries={w: args.max_queries or 4 for w in QPS}, seconds=args.seconds or 20.0,
                    total_seconds=args.total_seconds or math.inf, token_budget=256)
    return dict(shape="llama-3.1-8b", dtype=torch.bfloat16, token_scale=1.0, time_scale=1.0,
                queries={w: args.max_queries or n for w, n in DEFAULT_QUERIES.items()},
                seconds=args.seconds or 45.0, total_seconds=args.total_seconds or 215.0, token_budget=TOKEN_BUDGET)


def kv_blocks(device: Any, config: Any, dtype: Any, need_tokens: int, kv_gib: float | None) -> tuple[int, str]:
    """Blocks for the KV pool and how they were chosen: the runs' prompts all resident at once (with a
    step's worth to spare), within free device memory less 16 GiB for the weights' neighbours."""
    import torch

    from inference_svc.engine.kv_cache import kv_bytes_per_block

    per_block = kv_bytes_per_block(config, BLOCK, dtype)
    need = -(-(need_tokens + 2 * TOKEN_BUDGET) // BLOCK)
    if kv_gib is not None:
        return int(kv_gib * 2**30 // per_block), f"--kv-gib {kv_gib}"
    if device.type != "cuda":
        return need, "the runs' prompts"
    free, _ = torch.cuda.mem_get_info(device)
    weights = _parameters(config) * torch.empty((), dtype=dtype).element_size()
    room = max(0, free - weights - 16 * 2**30) // per_block
    if room < need:
        return room, f"free memory ({free / 2**30:.1f} GiB, less the weights and 16 GiB) below the need"
    return need, f"the runs' prompts ({need_tokens} tokens) fit in free memory ({free / 2**30:.1f} GiB)"


def _parameters(config: Any) -> int:
    h, d = config.hidden_size, config.head_dim
    layer = h * d * (config.num_heads + 2 * config.num_kv_heads) + config.num_heads * d * h \
        + 3 * h * config.intermediate_size
    return config.num_layers * layer + 2 * config.vocab_size * h


def run_bench_gpu_replay(args: argparse.Namespace) -> int:
    began = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f} s] {msg}", flush=True)

    if args.make_traces:
        return make_traces(args.trace_dir, args.passages, args.tokenizer, say)

    from load_tests.gpu_bench import bench_device

    device = bench_device(args)
    if device is None:
        return 2
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in QPS]
    if unknown or not workloads:
        print(f"error: --workloads takes {', '.join(QPS)}; got {args.workloads!r}", file=sys.stderr)
        return 2
    plan = _plan(args)
    traces: dict[str, TokenTrace] = {}
    for w in workloads:
        try:
            trace = read_token_trace(args.trace_dir / f"{w}.jsonl")
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        queries = tuple(q.scaled(plan["token_scale"], plan["time_scale"]) for q in trace.queries[:plan["queries"][w]])
        traces[w] = replace(trace, queries=queries)
    return _replay_all(args, plan, traces, device, say, began)


def _replay_all(args: argparse.Namespace, plan: dict[str, Any], traces: dict[str, TokenTrace], device: Any,
                say: Callable[[str], None], began: float) -> int:
    import torch

    from inference_svc.engine.models import random_llama_config
    from load_tests.gpu_measures import EngineSetup
    from load_tests.replay_run import poisson_arrivals

    config = random_llama_config(plan["shape"])
    need = max(sum(HEAD_TOKENS + q.peak_tokens + SUFFIX_TOKENS + 1 for q in t.queries) for t in traces.values())
    blocks, why = kv_blocks(device, config, plan["dtype"], need, args.kv_gib)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    say(f"{name}: the {plan['shape']} shape ({str(plan['dtype']).removeprefix('torch.')}), random weights; "
        f"KV pool {blocks} blocks of {BLOCK} ({blocks * BLOCK} tokens): {why}")
    # auto: the Triton kernels on CUDA; SDPA on the CPU dry run (Triton's interpreter takes seconds a step)
    setup = EngineSetup(config, device, plan["dtype"], attention="auto", cuda_graphs=False)
    runner = setup.runner(blocks)
    engine_config = dict(token_budget=plan["token_budget"], policy="fcfs", eviction="recompute")
    say(f"model and KV pool ready, attention {runner.attention}; warming the kernels up")
    warmup_s = _warm_up(setup.engine(blocks, runner=runner, **engine_config), config.vocab_size,
                        plan["token_budget"], device)
    say(f"warm-up done in {warmup_s:.1f} s")
    out: dict[str, Any] = {
        "gpu": name, "device": str(device), "torch": torch.__version__, "small": bool(args.small),
        "shape": plan["shape"], "dtype": str(plan["dtype"]).removeprefix("torch."), "tensor_parallel": 1,
        "attention": runner.attention, "output_tokens": 1, "policy": "fcfs", "eviction": "recompute",
        "token_budget": plan["token_budget"],
        "block_size": BLOCK, "kv_blocks": blocks, "kv_tokens": blocks * BLOCK, "kv_sizing": why,
        "token_scale": plan["token_scale"], "time_scale": plan["time_scale"], "seed": args.seed,
        "prompt": {"head_tokens": HEAD_TOKENS, "suffix_tokens": SUFFIX_TOKENS},
        "ttft_definitions": {"ttft": "first token minus the last chunk's arrival (the paper's metric)",
                             "ttft_from_arrival": "first token minus the query's arrival"},
        "warmup_s": round(warmup_s, 2), "paper": PAPER, "workloads": {}, "runs": [],
        "note": "one GPU (tensor parallel 1), random weights; the paper ran tensor parallel 2",
    }
    runs_left = 2 * len(traces)
    for w, trace in traces.items():
        qps = QPS[w] / plan["time_scale"]
        arrivals = [START_DELAY_S + a for a in poisson_arrivals(len(trace.queries), qps, args.seed)]
        tokens = [QueryTokens(q, config.vocab_size, args.seed) for q in trace.queries]
        stats = trace.statistics()
        out["workloads"][w] = {"qps": qps, "paper_qps": QPS[w], "trace": {**stats, "seed": trace.meta.get("seed"),
                                                                          "meta": trace.meta}}
        say(f"{w}: {stats['queries']} queries at {qps:g} QPS, {stats['tokens_mean']} tokens mean "
            f"(p95 {stats['tokens_p95']}), retrieval {stats['retrieval_mean_s']} s mean, "
            f"{stats['retrieval_max_s']} s max")
        for streaming in (True, False):
            label = f"{w}-{'s' if streaming else 'ns'}"
            engine = setup.engine(blocks, runner=runner, **engine_config)
            cap = min(plan["seconds"], (plan["total_seconds"] - (time.perf_counter() - began)) / runs_left)
            runs_left -= 1
            say(f"{label}: replaying (at most {cap:.0f} s)")
            records, seconds = replay(engine, trace.queries, tokens, arrivals, streaming=streaming,
                                      seconds=cap, say=say, label=label)
            row = {"workload": w, "streaming": streaming, **summarize(records, seconds, engine.counters)}
            out["runs"].append(row)
            say(f"{label}: TTFT p50 {row['ttft_p50_s']} s, p95 {row['ttft_p95_s']} s "
                f"(from arrival {row['ttft_from_arrival_p50_s']} / {row['ttft_from_arrival_p95_s']} s), "
                f"{row['answered']}/{row['queries']} answered, {row['preemptions']} preemptions")
            del engine
    out["ratios"] = _ratios(out["runs"])
    out["seconds"] = round(time.perf_counter() - began, 1)
    _print(out)
    if args.json:
        write_json(args.json, out)
        say(f"wrote {args.json}")
    return 0


def _warm_up(engine: Any, vocab: int, budget: int, device: Any) -> float:
    """Compile the kernels on a full-budget step, a partial one and a packed batch, outside the timed runs."""
    import random

    import torch

    from inference_svc.engine.request import Segment
    from inference_svc.engine.sampler import SamplingParams

    start = time.perf_counter()
    rng = random.Random(9)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    for i, n in enumerate((budget + budget // 3, 100, 700, 33)):
        engine.open(f"w{i}", [Segment(token_ids=tuple(rng.choices(range(3, vocab), k=n)))], params)
        engine.finish(f"w{i}")
    while engine.has_unfinished():
        engine.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _ratios(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Not streaming over streaming, per workload, at p50 and p95, of both TTFTs; `headline` at the
    percentile the paper reports for the workload, of its metric (TTFT from the last chunk)."""
    out: dict[str, Any] = {}
    for w in dict.fromkeys(r["workload"] for r in runs):
        s = next((r for r in runs if r["workload"] == w and r["streaming"]), None)
        ns = next((r for r in runs if r["workload"] == w and not r["streaming"]), None)
        if s is None or ns is None:
            continue
        row = {f"{metric}_{p}": ratio(ns[f"{metric}_{p}_s"], s[f"{metric}_{p}_s"])
               for metric in ("ttft", "ttft_from_arrival") for p in ("p50", "p95")}
        row["headline"] = row[f"ttft_{RATIO_AT[w]}"]
        row["headline_at"] = RATIO_AT[w]
        out[w] = row
    return out


def _print(out: dict[str, Any]) -> None:
    print(f"\n{out['gpu']} · {out['shape']} {out['dtype']} · TP {out['tensor_parallel']} · fcfs · "
          f"budget {out['token_budget']} · KV {out['kv_tokens']} tokens · warm-up {out['warmup_s']} s")
    print("| workload | QPS | mode | answered | TTFT p50 s | TTFT p95 s | from arrival p50 s | p95 s | preemptions |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in out["runs"]:
        qps = out["workloads"][r["workload"]]["qps"]
        print(f"| {r['workload']} | {qps:g} | {'streaming' if r['streaming'] else 'not streaming'} | "
              f"{r['answered']}/{r['queries']} | {r['ttft_p50_s']} | {r['ttft_p95_s']} | "
              f"{r['ttft_from_arrival_p50_s']} | {r['ttft_from_arrival_p95_s']} | {r['preemptions']} |")
    paper = {"crawler": out["paper"]["crawler_p50_ratio"], "anns": out["paper"]["anns_p95_ratio"]}
    for w, r in out["ratios"].items():
        low, high = paper[w]
        print(f"{w}: not streaming / streaming TTFT at {r['headline_at']}: {r['headline']}x "
              f"(paper {low}-{high}x, TP 2); from arrival p50 {r['ttft_from_arrival_p50']}x, "
              f"p95 {r['ttft_from_arrival_p95']}x")
