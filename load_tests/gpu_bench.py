"""`streamrag bench gpu`: the engine on one GPU, in at most five minutes, with random weights.

Reports, in one JSON (the keys of design section 10 first):
- the machine: the card, torch and Triton, and in the same run bf16 matmul TFLOP/s and HBM copy TB/s;
- exactness in fp32 (the 135M shape): streamed appends, a replaced middle document, preemption by
  recompute and by swap give the tokens of one-shot Generate; chunked logits within 1e-3 of SDPA's;
- prefill MFU (the 8B shape, bf16) one shot and in 512-token chunks at 2k and 8k tokens (and 512 one
  shot), against transformers' forward in the same run; MFU is against the matmul rate measured here;
- decode step ms through the Engine at concurrency 1, 16 and 64 over 1,024-token prompts: the first
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
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from load_tests import gpu_measures as m

DOC_TOKENS, HEAD_TOKENS, NUM_DOCS = 1000, 256, 8


def add_bench_gpu_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", help="cuda[:N], or cpu for the dry run (with --small)")
    parser.add_argument("--small", action="store_true", help="tiny shapes and sizes: the CPU dry run")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--concurrency", type=int, nargs="+", default=None, help="decode batch sizes (1 16 64)")
    parser.add_argument("--decode-steps", type=int, default=None, help="timed decode steps per pass (16)")
    parser.add_argument("--no-transformers", action="store_true", help="skip transformers' baselines")
    parser.add_argument("--compile-transformers", action="store_true",
                        help="also time transformers' generate with a static cache and torch.compile (minutes)")


def _plan(small: bool) -> dict:
    if small:
        return dict(shape="tiny", exact_shape="tiny", dtype=torch.float32, prefill=[(128, None), (128, 32)],
                    context=48, concurrency=[1, 4], steps=3, head=16, doc=32, docs=4, blocks=256, runs=1,
                    exact_doc=16, matmul_n=512, copy_mib=64)
    return dict(shape="llama-3.1-8b", exact_shape="smollm2-135m", dtype=torch.bfloat16,
                prefill=[(512, None), (2048, None), (2048, 512), (8192, None), (8192, 512)], context=1024,
                concurrency=[1, 16, 64], steps=16, head=HEAD_TOKENS, doc=DOC_TOKENS, docs=NUM_DOCS, blocks=6144, runs=3,
                exact_doc=200, matmul_n=8192, copy_mib=2048)


def run_bench_gpu(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; the CPU dry run is --device cpu --small", file=sys.stderr)
        return 2
    if device.type == "cpu" and not args.small:
        print("error: on a CPU run the dry run, --device cpu --small", file=sys.stderr)
        return 2
    plan = _plan(args.small)
    if args.concurrency:
        plan["concurrency"] = args.concurrency
    if args.decode_steps:
        plan["steps"] = args.decode_steps
    began = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f} s] {msg}", flush=True)

    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)   # no per-shape plans, in the transformers baselines too
    attention = "triton"   # the CUDA default; on the CPU dry run the kernels run in Triton's interpreter
    out: dict = _machine(device, plan, say)

    say("exactness (fp32)")
    exact_setup = m.EngineSetup(m.random_llama_config(plan["exact_shape"]), device, torch.float32, attention)
    exact = m.exactness(exact_setup, doc_tokens=plan["exact_doc"])
    out["exact_fp32"] = bool(exact["appends"] and exact["update"] and exact["recompute"] and exact["swap"]
                             and exact["max_logit_diff"] <= 1e-3)
    out["exactness"] = exact
    say(f"exact in fp32: {out['exact_fp32']} {exact}")
    del exact_setup
    _free(device)

    config = m.random_llama_config(plan["shape"])
    setup = m.EngineSetup(config, device, plan["dtype"], attention)
    runner = setup.runner(plan["blocks"])
    say(f"loaded the {plan['shape']} shape ({plan['dtype']}) with random weights")
    hf = None if args.no_transformers else m.transformers_model(config, device, plan["dtype"])
    out["prefill"] = _prefill(runner, hf, config, plan, out["matmul_tflops"], say)
    engine = setup.engine(plan["blocks"], runner=runner, token_budget=8192)
    out["decode"] = _decode(engine, hf, config, plan, out["hbm_tb_s"], args, say)
    out["host_syncs_per_step"], out["launches_per_step"] = _device_calls(setup, runner, plan, say)
    out["streaming"] = _streaming(setup, runner, plan, say)
    out["seconds"] = round(time.perf_counter() - began, 1)
    _print(out)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        say(f"wrote {args.json}")
    return 0


def _machine(device: torch.device, plan: dict, say) -> dict:
    import triton

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    say(f"machine: {name}; measuring matmul and copy rates")
    return {"gpu": name, "device": str(device), "torch": torch.__version__, "triton": triton.__version__,
            "small": plan["shape"] == "tiny", "shape": plan["shape"], "dtype": str(plan["dtype"]).removeprefix("torch."),
            "matmul_tflops": _sig(m.matmul_tflops(device, plan["matmul_n"])),
            "hbm_tb_s": _sig(m.copy_tb_s(device, plan["copy_mib"]))}


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _prefill(runner, hf, config, plan: dict, tflops: float, say) -> list[dict]:
    rows = []
    rng = random.Random(1)
    for tokens, chunk in plan["prefill"]:
        ms = m.prefill_ms(runner, tokens, chunk, rng)
        flops = m.model_flops(config, tokens)
        row = {"tokens": tokens, "chunk": chunk, "ms": round(ms, 2), "mfu": round(flops / (ms * 1e9) / tflops, 3)}
        if hf is not None and chunk is None:
            hf_ms = m.transformers_prefill_ms(hf, tokens, runner.device, rng)
            row["transformers_mfu"] = round(flops / (hf_ms * 1e9) / tflops, 3)
        rows.append(row)
        say(f"prefill {tokens} tokens, chunk {chunk}: {ms:.1f} ms, MFU {row['mfu']:.2f}"
            + (f" (transformers {row['transformers_mfu']:.2f})" if "transformers_mfu" in row else ""))
    return rows


def _decode(engine, hf, config, plan: dict, hbm_tb_s: float, args, say) -> list[dict]:
    rows = []
    rng = random.Random(2)
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    if engine.runner.model.lm_head is not None:   # the embedding table is read per token, not whole
        weight_bytes -= engine.runner.model.embed_tokens.weight.numel() * engine.runner.model.embed_tokens.weight.element_size()
    kv_per_token = engine.runner.bytes_per_block // m.BLOCK
    for c in plan["concurrency"]:
        prompts = [m.ids(rng, plan["context"] + i, config.vocab_size) for i in range(c)]
        fresh = m.decode_steps(engine, prompts, plan["steps"], f"f{c}-")
        repeated = m.decode_steps(engine, prompts, plan["steps"], f"r{c}-")
        context = sum(len(p) for p in prompts) + c * (plan["steps"] // 2)
        roofline_ms = (weight_bytes + context * kv_per_token) / (hbm_tb_s * 1e9)
        fresh_ms, repeated_ms = statistics.median(fresh), statistics.median(repeated)
        row = {"concurrency": c, "context": plan["context"], "fresh_step_ms": round(fresh_ms, 3),
               "repeated_step_ms": round(repeated_ms, 3), "fresh_over_repeated": round(fresh_ms / repeated_ms, 3),
               "roofline_ms": round(roofline_ms, 3), "roofline_fraction": round(roofline_ms / fresh_ms, 3),
               "fresh_step_ms_range": [round(min(fresh), 3), round(max(fresh), 3)]}
        if hf is not None:
            row["transformers_step_ms"] = round(m.transformers_decode_ms(hf, c, plan["context"], plan["steps"],
                                                                         engine.runner.device, rng), 3)
            if args.compile_transformers and c == 1:
                row["transformers_compiled_step_ms"] = _compiled_transformers(hf, plan, engine.runner.device, rng)
        rows.append(row)
        say(f"decode x{c}: fresh {fresh_ms:.2f} ms, repeated {repeated_ms:.2f} ms, roofline {roofline_ms:.2f} ms "
            f"({row['roofline_fraction']:.0%})"
            + (f", transformers {row['transformers_step_ms']:.2f} ms" if "transformers_step_ms" in row else ""))
    return rows


def _compiled_transformers(hf, plan: dict, device: torch.device, rng) -> float | str:
    try:
        hf.generation_config.cache_implementation = "static"
        hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
        return round(m.transformers_decode_ms(hf, 1, plan["context"], plan["steps"], device, rng), 3)
    except Exception as exc:   # a baseline that does not compile here is reported, not fatal
        return f"failed: {type(exc).__name__}: {exc}"[:200]


def _device_calls(setup, runner, plan: dict, say) -> tuple[float | None, float | None]:
    engine = setup.engine(plan["blocks"], runner=runner, token_budget=8192, count_device_calls=True)
    rng = random.Random(3)
    c = plan["concurrency"][min(1, len(plan["concurrency"]) - 1)]
    prompts = [m.ids(rng, plan["context"], setup.config.vocab_size) for _ in range(c)]
    syncs, launches = [], []
    params = m.SamplingParams(max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.open(f"c{i}", [m.Segment(token_ids=prompt)], params)
        engine.finish(f"c{i}")
    while engine.has_unfinished():
        engine.step()
        last = engine.last_step
        if last.decode_tokens == c and last.tokens == c and last.launches is not None:
            syncs.append(last.host_syncs)
            launches.append(last.launches)
    if not syncs:
        say("launches and syncs: not counted on a CPU")
        return None, None
    say(f"per decode step at concurrency {c}: {statistics.median(launches)} launches, "
        f"{statistics.median(syncs)} host syncs")
    return statistics.median(syncs), statistics.median(launches)


def _streaming(setup, runner, plan: dict, say) -> list[dict]:
    rows = []
    rng = random.Random(4)
    for gap in (100, 25):
        pairs = []
        for run in range(plan["runs"]):   # fresh documents each run: no prefix cache hit between runs
            head = m.ids(rng, plan["head"], setup.config.vocab_size)
            docs = [m.ids(rng, plan["doc"], setup.config.vocab_size) for _ in range(plan["docs"])]
            engine = setup.engine(plan["blocks"], runner=runner, token_budget=8192)
            streamed = m.ttft_after_last_doc(engine, head, docs, gap, True, f"s{run}")
            engine = setup.engine(plan["blocks"], runner=runner, token_budget=8192)
            whole = m.ttft_after_last_doc(engine, head, docs, gap, False, f"n{run}")
            pairs.append((streamed, whole))
        streamed = statistics.median(p[0] for p in pairs)
        whole = statistics.median(p[1] for p in pairs)
        rows.append({"gap_ms": gap, "streamed_ttft_ms": round(streamed, 2), "not_streamed_ttft_ms": round(whole, 2),
                     "speedup": round(whole / streamed, 3),
                     "speedups": [round(w / s, 3) for s, w in pairs]})
        say(f"streaming, {gap} ms gaps: {streamed:.1f} ms against {whole:.1f} ms not streamed "
            f"({whole / streamed:.2f}x)")
    return rows


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _print(out: dict) -> None:
    print(f"\n{out['gpu']} · torch {out['torch']} · triton {out['triton']} · "
          f"matmul {out['matmul_tflops']} TFLOP/s · copy {out['hbm_tb_s']} TB/s · exact fp32: {out['exact_fp32']}")
    print("| concurrency | fresh step ms | repeated | fresh/repeated | roofline ms | share of roofline |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in out["decode"]:
        print(f"| {r['concurrency']} | {r['fresh_step_ms']:.2f} | {r['repeated_step_ms']:.2f} | "
              f"{r['fresh_over_repeated']:.2f} | {r['roofline_ms']:.2f} | {r['roofline_fraction']:.0%} |")
    print("| prefill tokens | chunk | MFU | transformers MFU |\n|---:|---:|---:|---:|")
    for r in out["prefill"]:
        print(f"| {r['tokens']} | {r['chunk'] or 'one shot'} | {r['mfu']:.0%} | "
              f"{format(r['transformers_mfu'], '.0%') if 'transformers_mfu' in r else '-'} |")
    for r in out["streaming"]:
        print(f"streaming at {r['gap_ms']} ms gaps: {r['speedup']:.2f}x")
    print(f"per decode step: {out['launches_per_step']} launches, {out['host_syncs_per_step']} host syncs")
