"""`streamrag bench disagg`: disaggregated prefill/decode against one colocated replica, same cores.

Two modes on the same total cores, each replica a `streamrag serve inference` process pinned with
CPU affinity (inherited from this process at start) and as many torch threads as cores:
- `colocated`: one replica (role both) on cores 0-1; every call is a plain StreamPrompt;
- `disaggregated`: a prefill replica on core 0 and a decode replica on core 1; every StreamPrompt
  goes to the prefill replica with the decode replica as its hand-off target (docs/disagg.md).

Workload (per seed): streamed RAG prompts arriving at a steady rate (`--rates`, requests/s): a
question head, `--chunks` context chunks of about `--chunk-words` words each `--chunk-gap-s`
apart (as a retriever streams them), then finish; each decodes `--max-tokens` tokens (greedy,
EOS ignored, speculative decoding off, so every token is one step). Per request, measured at the
client: TTFT from the finish to the first token, inter-token latencies (ITL) between consecutive
tokens, and, disaggregated, the transfer after the last chunk (KV_HANDOFF: from the tail's KV
being computed to the decode side's ack). A request meets its targets when its TTFT <=
`--ttft-target-s` and its own ITL p99 <= `--itl-target-ms`; goodput = such requests / the run's
wall time (first arrival to last answer).

    streamrag bench disagg --json /tmp/disagg.json

writes `{"rows": [{"mode", "seed", "rate_rps", "itl_p50_ms", "itl_p99_ms", "ttft_p50_s", "ttft_p99_s",
"transfer_ms_after_last_chunk_p50", "goodput_rps", ...}], "requests": [...], "targets": {...}}`,
one row per mode, rate and seed, plus `idle`: per mode, the `--idle-probes` requests sent one at a
time before the load; and prints a table of medians over seeds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from inference_svc.launch import start_inference_service
from load_tests.runner import add_seeds_arg, choice_list, positive_float_list, write_json
from protos import common_pb2, inference_pb2, inference_pb2_grpc
from protos.metadata import DECODE_TARGET_KEY
from servicekit.progress import say

WORDS = (
    "python", "file", "list", "dict", "read", "write", "open", "close", "module", "import", "function", "class",
    "method", "string", "bytes", "loop", "iterate", "value", "key", "error", "exception", "raise", "return",
    "yield", "generator", "context", "manager", "path", "stream", "buffer", "line", "text", "encoding", "socket",
    "thread", "process", "queue", "lock", "event", "async", "await", "task", "future",
)
MODES = ("colocated", "disaggregated")
HANDOFF = re.compile(r"transfer ([0-9.]+) ms after the last chunk's KV")


@dataclass
class Result:
    mode: str
    seed: int
    rate_rps: float
    index: int
    sent_finish: float = 0.0
    token_times: list[float] = field(default_factory=list)
    transfer_ms: float | None = None
    fallback: bool = False
    error: str = ""

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.sent_finish if self.token_times else None

    @property
    def itls_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.token_times, self.token_times[1:], strict=False)]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def prompt(rng: random.Random, chunks: int, words: int) -> tuple[str, list[str], str]:
    head = (f"<|im_start|>system\nYou answer questions using the documents below.<|im_end|>\n<|im_start|>user\n"
            f"Question {rng.randrange(10**6)}: how do I {rng.choice(WORDS)} a {rng.choice(WORDS)}?\nDocuments:\n")
    docs = [f"[doc {i}] " + " ".join(rng.choice(WORDS) for _ in range(words)) + "\n" for i in range(chunks)]
    return head, docs, "<|im_end|>\n<|im_start|>assistant\n"


async def one_request(stub, result: Result, head: str, docs: list[str], suffix: str, gap_s: float,
                      max_tokens: int, metadata) -> None:
    def update(**kind):
        return inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(**kind))

    def segments(text: str):
        return [common_pb2.Segment(text=text)]

    async def messages():
        sampling = common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True, speculation="off")
        yield update(open=inference_pb2.PromptOpen(request_id=f"{result.mode}-{result.seed}-{result.rate_rps}-"
                                                              f"{result.index}", sampling=sampling,
                                                   segments=segments(head)))
        for doc in docs:
            await asyncio.sleep(gap_s)
            yield update(append=inference_pb2.PromptAppend(segments=segments(doc)))
        await asyncio.sleep(gap_s)
        result.sent_finish = time.monotonic()
        yield update(finish=inference_pb2.PromptFinish(segments=segments(suffix)))

    try:
        async for response in stub.StreamPrompt(messages(), metadata=metadata, timeout=600):
            event = response.event
            kind = event.WhichOneof("kind")
            if kind == "token":
                result.token_times.append(time.monotonic())
            elif kind == "lifecycle":
                name = common_pb2.LifecycleEventKind.Name(event.lifecycle.kind)
                if name.endswith("KV_HANDOFF") and (match := HANDOFF.search(event.lifecycle.detail)):
                    result.transfer_ms = float(match.group(1))
                elif name.endswith("KV_TRANSFER_FALLBACK"):
                    result.fallback = True
    except grpc.RpcError as exc:
        result.error = f"{exc.code().name}: {exc.details()}"


async def run_load(mode: str, address: str, decode_address: str | None, seed: int, rate: float,
                   args: argparse.Namespace) -> list[Result]:
    rng = random.Random(seed * 1000 + int(rate * 100))
    metadata = ((DECODE_TARGET_KEY, decode_address),) if decode_address else ()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        results, tasks = [], []
        for i in range(args.requests):
            head, docs, suffix = prompt(rng, args.chunks, args.chunk_words)
            result = Result(mode, seed, rate, i)
            results.append(result)
            tasks.append(asyncio.create_task(one_request(stub, result, head, docs, suffix, args.chunk_gap_s,
                                                         args.max_tokens, metadata)))
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*tasks)
    return results


def row(results: list[Result], args: argparse.Namespace, wall_s: float) -> dict:
    done = [r for r in results if not r.error and len(r.token_times) == args.max_tokens]
    itls = [x for r in done for x in r.itls_ms]
    ttfts = [r.ttft_s for r in done]
    transfers = [r.transfer_ms for r in done if r.transfer_ms is not None]
    good = [r for r in done if r.ttft_s <= args.ttft_target_s and percentile(r.itls_ms, 99) <= args.itl_target_ms]
    first = results[0]
    return {"mode": first.mode, "seed": first.seed, "rate_rps": first.rate_rps, "requests": len(results),
            "completed": len(done), "fallbacks": sum(r.fallback for r in results),
            "errors": sorted({r.error for r in results if r.error}),
            "itl_p50_ms": _round(percentile(itls, 50)), "itl_p99_ms": _round(percentile(itls, 99)),
            "ttft_p50_s": _round(percentile(ttfts, 50), 3), "ttft_p99_s": _round(percentile(ttfts, 99), 3),
            "transfer_ms_after_last_chunk_p50": _round(percentile(transfers, 50)),
            "met_targets": len(good), "goodput_rps": round(len(good) / wall_s, 4), "wall_s": round(wall_s, 2)}


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


@contextlib.contextmanager
def pinned(cores: set[int]):
    """Start children on `cores` (they inherit this thread's affinity)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def start(role: str, cores: set[int], args: argparse.Namespace):
    threads = str(len(cores))
    with pinned(cores):
        return start_inference_service("native", args.model, dtype=args.dtype, extra_args=["--role", role],
                                       env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads},
                                       log_path=Path(f"/tmp/streamrag-disagg-{role}.log"))


async def warm_up(mode: str, address: str, decode_address: str | None, args: argparse.Namespace) -> list[Result]:
    """One request to warm up, then `--idle-probes` requests one at a time: with nothing else
    running, their hand-off is the transfer alone (under load it also waits for the decode
    replica's running step to end before the tail is imported)."""
    rng = random.Random(12345)
    metadata = ((DECODE_TARGET_KEY, decode_address),) if decode_address else ()
    probes = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for i in range(1 + args.idle_probes):
            head, docs, suffix = prompt(rng, args.chunks, args.chunk_words)
            result = Result(mode, -1, 0, i)
            await one_request(stub, result, head, docs, suffix, args.chunk_gap_s, 8, metadata)
            probes.append(result)
    return probes[1:]


def run_mode(mode: str, args: argparse.Namespace) -> tuple[list[dict], list[dict], dict]:
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        raise SystemExit("bench disagg needs 2 cores")
    if mode == "colocated":
        services = [start("both", set(cores), args)]
        address, decode_address = services[0].address, None
    else:
        services = [start("prefill", {cores[0]}, args), start("decode", {cores[1]}, args)]
        address, decode_address = services[0].address, services[1].address
    rows, raw = [], []
    try:
        probes = asyncio.run(warm_up(mode, address, decode_address, args))
        idle = {"mode": mode, "idle_probes": len(probes),
                "ttft_p50_s": _round(percentile([r.ttft_s for r in probes if r.ttft_s is not None], 50), 3),
                "transfer_ms_after_last_chunk_p50": _round(percentile([r.transfer_ms for r in probes
                                                                       if r.transfer_ms is not None], 50))}
        say(f"{mode} idle: {idle}")
        for rate in args.rates:
            for seed in args.seeds:
                started = time.monotonic()
                results = asyncio.run(run_load(mode, address, decode_address, seed, rate, args))
                wall = max((r.token_times[-1] for r in results if r.token_times), default=time.monotonic()) - started
                rows.append(row(results, args, wall))
                raw += [{**asdict(r), "ttft_s": r.ttft_s, "itl_p99_ms": percentile(r.itls_ms, 99)} for r in results]
                say(f"{mode} rate {rate} seed {seed}: {rows[-1]}")
    finally:
        for service in services:
            service.stop()
    return rows, raw, idle


def add_bench_disagg_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--raw", type=Path, default=None, help="write every request's times here")
    parser.add_argument("--model", type=Path, default=None, help="default: the embedded model")
    parser.add_argument("--dtype", default="bfloat16")
    add_seeds_arg(parser)
    parser.add_argument("--rates", type=positive_float_list, default=[0.2, 0.4], help="comma-separated requests/s")
    parser.add_argument("--requests", type=int, default=8, help="per rate and seed")
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--chunk-words", type=int, default=120)
    parser.add_argument("--chunk-gap-s", type=float, default=0.3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ttft-target-s", type=float, default=1.0, help="TTFT from the finish")
    parser.add_argument("--itl-target-ms", type=float, default=150.0, help="a request's own ITL p99")
    parser.add_argument("--idle-probes", type=int, default=3,
                        help="requests sent one at a time before the load (the hand-off with nothing else running)")
    parser.add_argument("--modes", type=choice_list(MODES), default=list(MODES), help="comma-separated: "
                        + ", ".join(MODES))


def run_bench_disagg(args: argparse.Namespace) -> int:
    rows, raw, idle = [], [], []
    for mode in args.modes:
        mode_rows, mode_raw, mode_idle = run_mode(mode, args)
        idle.append(mode_idle)
        rows += mode_rows
        raw += mode_raw
    out = {"rows": rows, "idle": idle, "targets": {"ttft_s": args.ttft_target_s, "itl_p99_ms": args.itl_target_ms},
           "workload": {"chunks": args.chunks, "chunk_words": args.chunk_words, "chunk_gap_s": args.chunk_gap_s,
                        "max_tokens": args.max_tokens, "requests": args.requests, "rates": args.rates,
                        "dtype": args.dtype},
           "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}}
    if args.json:
        write_json(args.json, out)
    if args.raw:
        write_json(args.raw, {"requests": raw})
    print(table(rows, idle))
    return 0


def table(rows: list[dict], idle: list[dict]) -> str:
    keys = ("itl_p50_ms", "itl_p99_ms", "ttft_p50_s", "ttft_p99_s", "transfer_ms_after_last_chunk_p50", "goodput_rps")
    lines = ["| mode | rate | " + " | ".join(keys) + " |", "|---|---:|" + "---:|" * len(keys)]
    for mode, rate in dict.fromkeys((r["mode"], r["rate_rps"]) for r in rows):
        group = [r for r in rows if (r["mode"], r["rate_rps"]) == (mode, rate)]
        cells = []
        for key in keys:
            values = [r[key] for r in group if r[key] is not None]
            cells.append(f"{statistics.median(values):g} ({min(values):g}-{max(values):g})" if values else "-")
        lines.append(f"| {mode} | {rate:g} | " + " | ".join(cells) + " |")
    lines += [f"{r['mode']} with nothing else running ({r['idle_probes']} requests): TTFT p50 {r['ttft_p50_s']} s, "
              f"hand-off p50 {r['transfer_ms_after_last_chunk_p50']} ms" for r in idle]
    return "\n".join(lines)
