"""`streamrag bench concurrent`: prefill throughput under concurrency, ours against vLLM.

N `Generate` calls of about the same length are sent at once (1 output token: a prefill
instance), and throughput is the prompt tokens of all N over the wall time from the first
send to the last answer. Both engines run as real Inference services on loopback, each in its
own process (`streamrag serve inference --backend B`, as in production), one at a time (an idle
vLLM service beside the native one slowed it on 2 cores): each is started, warmed up, runs one
burst per seed and is stopped before the next starts. Prompts are random token ids, new for
every seed and engine, so no prefix cache helps either side.

    streamrag bench concurrent --engine native,vllm --concurrency 16 --prompt-tokens 1150 \
        --seeds 0,1,2 --json out/concurrent.json

Prints one row per engine and seed and the per-seed ratio native / vLLM with its median and
min-max spread (load_tests.runner.spread).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DEFAULT_TOKEN_BUDGET, DTYPE_CHOICES
from load_tests.runner import add_seeds_arg, positive_int, spread, write_json
from servicekit.progress import say

ENGINES = ("native", "vllm")
SPECIAL_MARGIN = 256            # random ids stay clear of the vocabulary's first and last (special) tokens


def random_prompt(vocab_size: int, tokens: int, rng: random.Random) -> list[int]:
    return [rng.randrange(SPECIAL_MARGIN, vocab_size - SPECIAL_MARGIN) for _ in range(tokens)]


async def burst(stub: Any, prompts: list[list[int]], tag: str) -> dict[str, Any]:
    """Send every prompt at once as a Generate call (max_tokens 1); wall time and TTFTs."""
    from protos import common_pb2, inference_pb2

    async def one(i: int, ids: list[int]) -> float:
        request = inference_pb2.GenerateRequest(
            request_id=f"{tag}-{i}", segments=[common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=ids))],
            sampling=common_pb2.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        first = None
        async for response in stub.Generate(request, timeout=1800):
            if first is None and response.event.WhichOneof("kind") == "token":
                first = time.perf_counter() - started
        if first is None:
            raise RuntimeError(f"request {tag}-{i} ended without a token")
        return first

    started = time.perf_counter()
    ttfts = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))
    wall = time.perf_counter() - started
    tokens = sum(len(p) for p in prompts)
    return {"wall_s": round(wall, 3), "prompt_tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
            "ttft_p50_s": round(sorted(ttfts)[len(ttfts) // 2], 3), "ttft_max_s": round(max(ttfts), 3)}


def start_service(args: argparse.Namespace, engine: str) -> Any:
    """A running service subprocess (`inference_svc.launch`: its own process, as in production, so it
    never shares the client's interpreter); the native engine with every default but the token
    budget, vLLM with its own scheduler."""
    from inference_svc.launch import start_inference_service

    say(f"starting the {engine} inference service (token budget {args.token_budget}, dtype {args.dtype})")
    return start_inference_service(
        engine, args.model, max_streams=256, policy="default" if engine == "vllm" else None, dtype=args.dtype,
        device=args.device, extra_args=["--token-budget", str(args.token_budget)],
        python=args.vllm_python if engine == "vllm" else None)


async def measure(address: str, engine: str, seeds: list[int], args: argparse.Namespace,
                  progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Warm the engine up once (one-time costs are not measured), then one burst per seed."""
    import grpc

    from protos import inference_pb2, inference_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        vocab = (await stub.Describe(inference_pb2.DescribeRequest(), timeout=60)).model_info.vocab_size

        def prompts(key: str) -> list[list[int]]:
            rng = random.Random(f"{key}-{engine}")
            return [random_prompt(vocab, args.prompt_tokens, rng) for _ in range(args.concurrency)]

        progress(f"{engine}: warm-up ({args.concurrency} x {args.prompt_tokens} tokens)")
        await burst(stub, prompts("warm"), f"warm-{engine}")
        rows = []
        for seed in seeds:
            row = {"engine": engine, "seed": seed, **await burst(stub, prompts(str(seed)), f"s{seed}-{engine}")}
            progress(f"seed {seed} {engine}: {row['tokens_per_s']} tokens/s ({row['wall_s']} s)")
            rows.append(row)
        return rows


def run(args: argparse.Namespace, progress: Callable[[str], None] = say) -> dict[str, Any]:
    """One engine's service at a time: on a 2-core machine an idle vLLM service beside the native one
    cost the native bursts a quarter of their throughput (docs/results.md, "Ours against vLLM")."""
    engines = [e.strip() for e in args.engine.split(",") if e.strip()]
    if not engines or any(e not in ENGINES for e in engines):
        raise ValueError(f"--engine: a comma-separated list of {', '.join(ENGINES)}, got {args.engine!r}")
    seeds = args.seeds
    rows: list[dict[str, Any]] = []
    for engine in engines:
        service = start_service(args, engine)
        try:
            rows += asyncio.run(measure(service.address, engine, seeds, args, progress))
        finally:
            service.stop()
    result: dict[str, Any] = {"concurrency": args.concurrency, "prompt_tokens": args.prompt_tokens,
                              "token_budget": args.token_budget, "dtype": args.dtype, "rows": rows,
                              "tokens_per_s": {e: spread([r["tokens_per_s"] for r in rows if r["engine"] == e])
                                               for e in engines}}
    if len(engines) == 2:
        by = {(r["engine"], r["seed"]): r["tokens_per_s"] for r in rows}
        result["native_over_vllm"] = spread([by["native", s] / by["vllm", s] for s in seeds])
    return result


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['concurrency']} concurrent Generate calls x {result['prompt_tokens']} tokens, "
             f"max_tokens 1, token budget {result['token_budget']}, dtype {result['dtype']}", "",
             "| engine | seed | tokens/s | wall s | TTFT p50 s | TTFT max s |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['engine']} | {r['seed']} | {r['tokens_per_s']} | {r['wall_s']} | {r['ttft_p50_s']} | "
              f"{r['ttft_max_s']} |" for r in result["rows"]]
    lines.append("")
    for engine, s in result["tokens_per_s"].items():
        lines.append(f"{engine}: median {s['median']:.1f} tokens/s ({s['min']:.1f}-{s['max']:.1f})")
    if "native_over_vllm" in result:
        s = result["native_over_vllm"]
        lines.append(f"native / vLLM, per seed: median {s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})")
    return "\n".join(lines)


def add_bench_concurrent_args(parser: argparse.ArgumentParser) -> None:
    from load_tests.replay import _default_vllm_python

    parser.add_argument("--engine", default="native,vllm", help="comma-separated: native and/or vllm")
    parser.add_argument("--concurrency", type=positive_int, default=16, help="Generate calls sent at once")
    parser.add_argument("--prompt-tokens", type=positive_int, default=1150, help="tokens per prompt")
    add_seeds_arg(parser, what="seeds (new prompts for each)")
    parser.add_argument("--token-budget", type=positive_int, default=DEFAULT_TOKEN_BUDGET, help="tokens per step")
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--vllm-python", default=_default_vllm_python(),
                        help="interpreter with the vllm extra (default: $STREAMRAG_VLLM_PYTHON, else /opt/vllm-venv)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def run_bench_concurrent(args: argparse.Namespace) -> int:
    try:
        result = run(args)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(render(result))
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0
