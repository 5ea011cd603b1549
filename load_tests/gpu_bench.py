"""`streamrag bench gpu`: the engine on one GPU, in at most five minutes, with random weights.

Reports, in one JSON (the keys of design section 10 first):
- the machine: the card, torch and Triton, and in the same run bf16 matmul TFLOP/s and HBM copy TB/s;
- exactness in fp32 (the 135M shape): streamed appends, a replaced middle document, preemption by
  recompute and by swap give the tokens of one-shot Generate; chunked logits within 1e-3 of SDPA's;
- prefill MFU (the 8B shape, bf16) one shot and in 512-token chunks at 512, 2k and 8k tokens, beside
  transformers' forward (one shot and chunked over its cache) in the same run, timed by
  prefill_bench.time_prefill; MFU is against the matmul rate measured here;
- decode step ms through the Engine at concurrency 1, 16 and 64 over 1,024-token prompts, and at
  concurrency 1 over 8k and 32k contexts (where the KV read is a large share of the roofline): the first
  pass over new context lengths ("fresh") and a second over the same lengths ("repeated"), against the
  roofline (the weights plus the KV read per step, at the measured copy rate) and transformers'
  `generate`;
- streaming TTFT against not streaming, a 256-token head and 8 documents of 1,000 tokens arriving 100
  and 25 ms apart, TTFT counted from the last document's arrival;
- kernel launches and host syncs per decode step (device_calls.py).

`--device cpu --small` is the dry run: the same steps on a few-layer shape, the Triton kernels in
Triton's interpreter, in under two minutes; a default-suite test runs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from load_tests.runner import positive_int_list, write_json

DOC_TOKENS, HEAD_TOKENS, NUM_DOCS = 1000, 256, 8


def add_bench_gpu_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", help="cuda[:N], or cpu for the dry run (with --small)")
    parser.add_argument("--small", action="store_true", help="tiny shapes and sizes: the CPU dry run")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--concurrency", type=positive_int_list, default=None,
                        help="comma-separated decode batch sizes (default 1,16,64)")
    parser.add_argument("--long-contexts", type=positive_int_list, default=None,
                        help="context lengths of the extra decode rows at concurrency 1 (default 8192,32768)")
    parser.add_argument("--decode-steps", type=int, default=None, help="timed decode steps per pass (16)")
    parser.add_argument("--no-transformers", action="store_true", help="skip transformers' baselines")
    parser.add_argument("--compile-transformers", action="store_true",
                        help="also time transformers' generate with a static cache and torch.compile (minutes)")


def _plan(small: bool) -> dict:
    import torch

    if small:
        return dict(shape="tiny", exact_shape="tiny", dtype=torch.float32, prefill=(128,), prefill_chunk=32,
                    context=48, concurrency=[1, 4], long_contexts=(96,), steps=3, head=16, doc=32, docs=4, blocks=256,
                    runs=1,
                    exact_doc=16, matmul_n=512, copy_mib=64)
    return dict(shape="llama-3.1-8b", exact_shape="smollm2-135m", dtype=torch.bfloat16,
                prefill=(512, 2048, 8192), prefill_chunk=512, context=1024,
                concurrency=[1, 16, 64], long_contexts=(8192, 32768), steps=16, head=HEAD_TOKENS, doc=DOC_TOKENS,
                docs=NUM_DOCS, blocks=6144, runs=3,
                exact_doc=200, matmul_n=8192, copy_mib=2048)


def bench_device(args: argparse.Namespace):
    """The device a GPU bench runs on: CUDA, or the CPU for its dry run (``--small``); None (said why) else."""
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; the CPU dry run is --device cpu --small", file=sys.stderr)
        return None
    if device.type == "cpu" and not args.small:
        print("error: on a CPU run the dry run, --device cpu --small", file=sys.stderr)
        return None
    return device


def run_bench_gpu(args: argparse.Namespace) -> int:
    import torch

    from inference_svc.engine.models import random_llama_config
    from load_tests import gpu_measures as m

    device = bench_device(args)
    if device is None:
        return 2
    plan = _plan(args.small)
    if args.concurrency:
        plan["concurrency"] = args.concurrency
    if args.long_contexts:
        plan["long_contexts"] = tuple(args.long_contexts)
    if args.decode_steps:
        plan["steps"] = args.decode_steps
    began = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f} s] {msg}", flush=True)

    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)   # no per-shape plans, in the transformers baselines too
    attention = "triton"   # the CUDA default; on the CPU dry run the kernels run in Triton's interpreter
    out: dict = m.machine_section(device, plan, say)

    say("exactness (fp32)")
    exact_setup = m.EngineSetup(random_llama_config(plan["exact_shape"]), device, torch.float32, attention)
    exact = m.exactness(exact_setup, doc_tokens=plan["exact_doc"])
    out["exact_fp32"] = bool(exact["appends"] and exact["update"] and exact["recompute"] and exact["swap"]
                             and exact["max_logit_diff"] <= 1e-3)
    out["exactness"] = exact
    say(f"exact in fp32: {out['exact_fp32']} {exact}")
    del exact_setup
    m.free_device(device)

    config = random_llama_config(plan["shape"])
    setup = m.EngineSetup(config, device, plan["dtype"], attention)
    runner = setup.runner(plan["blocks"])
    say(f"loaded the {plan['shape']} shape ({plan['dtype']}) with random weights")
    hf = None if args.no_transformers else m.baseline(lambda: m.transformers_model(config, device, plan["dtype"]))
    if isinstance(hf, str):
        out["transformers"], hf = hf, None
    out["prefill"] = m.prefill_section(runner, hf, config, plan, out["matmul_tflops"], say)
    engine = setup.engine(plan["blocks"], runner=runner)
    out["decode"] = m.decode_section(engine, hf, config, plan, out["hbm_tb_s"], args, say)
    out["host_syncs_per_step"], out["launches_per_step"] = m.device_calls_section(setup, runner, plan, say)
    out["streaming"] = m.streaming_section(setup, runner, plan, say)
    out["seconds"] = round(time.perf_counter() - began, 1)
    _print(out)
    if args.json:
        write_json(args.json, out)
        say(f"wrote {args.json}")
    return 0


def _share(value) -> str:
    return f"{value:.0%}" if isinstance(value, float) else str(value or "-")


def _print(out: dict) -> None:
    print(f"\n{out['gpu']} · torch {out['torch']} · triton {out['triton']} · "
          f"matmul {out['matmul_tflops']} TFLOP/s · copy {out['hbm_tb_s']} TB/s · exact fp32: {out['exact_fp32']}")
    print("| concurrency | context | fresh step ms | repeated | fresh/repeated | roofline ms | share of roofline |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in out["decode"]:
        print(f"| {r['concurrency']} | {r['context']} | {r['fresh_step_ms']:.2f} | {r['repeated_step_ms']:.2f} | "
              f"{r['fresh_over_repeated']:.2f} | {r['roofline_ms']:.2f} | {r['roofline_fraction']:.0%} |")
    print("| prefill tokens | chunk | MFU | transformers MFU |\n|---:|---:|---:|---:|")
    for r in out["prefill"]:
        print(f"| {r['tokens']} | {r['chunk'] or 'one shot'} | {r['mfu']:.0%} | "
              f"{_share(r.get('transformers_mfu'))} |")
    for r in out["streaming"]:
        print(f"streaming at {r['gap_ms']} ms gaps: {r['speedup']:.2f}x")
    print(f"per decode step: {out['launches_per_step']} launches, {out['host_syncs_per_step']} host syncs")
