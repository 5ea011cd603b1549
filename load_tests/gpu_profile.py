"""Where a GPU step's time goes: `python -m load_tests.gpu_profile --json OUT` (scripts/gpu_check.sh runs it).

`bench gpu` says how far each figure is from its ceiling; this says why. For a few decode steps and a
chunked prefill of the 8B shape (random weights, bf16) it runs the step under `torch.profiler` and
reports, per step: wall time (host clock around a synchronized step), the GPU's kernel time (the
sum of the kernels' device time: wall minus this is time the GPU sat idle), the kernels and launch
calls it took, and the kernels that took the most time. Decode is profiled through the Engine (CUDA
graphs, as served) and once more on an eager runner, whose kernels the profiler names one by one.

`--device cpu --small` is the dry run (tiny shape, fp32): it checks the wiring; a CPU has no kernels.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from inference_svc.engine.device_calls import LAUNCH_CALLS
from inference_svc.engine.model_runner import ChunkInput, ModelRunner
from inference_svc.engine.models import random_llama_config
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from load_tests.gpu_measures import BLOCK, EngineSetup, ids
from load_tests.runner import write_json

TOP_KERNELS = 8


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_us(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_steps(name: str, step, steps: int, device: torch.device) -> dict:
    """Profile ``steps`` calls of ``step`` (already warmed up): wall and kernel time per step, and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    walls = []
    with profile(activities=activities) as prof:
        for _ in range(steps):
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
            walls.append((time.perf_counter() - start) * 1e3)
    kernels: dict[str, list[float]] = defaultdict(list)
    launches = 0
    for event in prof.events():
        if any(call in event.name for call in LAUNCH_CALLS):
            launches += 1
        if getattr(event, "device_type", None) is not None and "CUDA" in str(event.device_type):
            kernels[event.name].append(_device_us(event))
    kernel_ms = sum(sum(v) for v in kernels.values()) / 1e3 / steps
    wall_ms = statistics.median(walls)
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
    return {
        "case": name, "steps": steps, "wall_ms": round(wall_ms, 3),
        "kernel_ms": round(kernel_ms, 3), "gpu_busy": round(kernel_ms / wall_ms, 3) if wall_ms else None,
        "kernels_per_step": round(sum(len(v) for v in kernels.values()) / steps, 1),
        "launch_calls_per_step": round(launches / steps, 1),
        "top_kernels": [{"name": k[:90], "ms_per_step": round(sum(v) / 1e3 / steps, 4),
                         "calls_per_step": round(len(v) / steps, 2),
                         "share": round(sum(v) / 1e3 / steps / kernel_ms, 3) if kernel_ms else None}
                        for k, v in top],
    }


def decode_case(setup: EngineSetup, runner, blocks: int, batch: int, context: int, steps: int, tag: str) -> dict:
    """Profile plain decode steps of ``batch`` sequences over ``context``-token prompts, through the Engine."""
    engine = setup.engine(blocks, runner=runner)
    rng = random.Random(context + batch)
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True, speculation="off")
    names = [f"{tag}{i}" for i in range(batch)]
    for name in names:
        engine.open(name, [Segment(token_ids=ids(rng, context, setup.config.vocab_size))], params)
        engine.finish(name)
    while any(not engine.requests[n].is_decoding for n in names):
        engine.step()
    for _ in range(3):   # warm-up: graph replays and the sampler's first calls
        engine.step()
    result = profile_steps(f"decode x{batch} over {context}" + ("" if runner.graph_replays else " (eager)"),
                           engine.step, steps, runner.device)
    for name in names:
        engine.abort(name)
        engine.release(name)
    return result


def prefill_case(runner, context: int, chunk: int, vocab: int) -> dict:
    """Profile the last ``chunk``-token chunk of a ``context``-token prompt (the chunk with the most to attend)."""
    rng = random.Random(context)
    prompt = list(ids(rng, context, vocab))
    table = list(range(-(-context // BLOCK)))
    for start in range(0, context - chunk, chunk):   # the KV the last chunk attends over
        runner.execute([ChunkInput(prompt[start:start + chunk], start, table, False)])
    last = context - chunk
    step = lambda: runner.execute([ChunkInput(prompt[last:], last, table, True)])   # noqa: E731
    step()
    label = f"prefill chunk {chunk} at {last}" if chunk < context else f"prefill {context} one shot"
    return profile_steps(label, step, 3, runner.device)


def run(device: torch.device, small: bool, say) -> dict:
    shape, dtype = ("tiny", torch.float32) if small else ("llama-3.1-8b", torch.bfloat16)
    contexts, batches, prefill, chunk, blocks, steps = (
        ((48, 96), (1, 4), 128, 32, 256, 2) if small else ((1024, 8192), (1, 16, 64), 8192, 512, 6144, 5))
    setup = EngineSetup(random_llama_config(shape), device, dtype, "triton")
    out: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
                 "shape": shape, "dtype": str(dtype).removeprefix("torch."), "cases": []}

    def record(case: dict) -> None:
        out["cases"].append(case)
        say(f"{case['case']}: wall {case['wall_ms']:.2f} ms, kernels {case['kernel_ms']:.2f} ms "
            f"({case['gpu_busy'] or 0:.0%} busy), {case['kernels_per_step']} kernels, "
            f"{case['launch_calls_per_step']} launch calls")

    runner = setup.runner(blocks)
    say(f"loaded {shape} ({out['dtype']})")
    for context in contexts:
        record(decode_case(setup, runner, blocks, 1, context, steps, f"g{context}-"))
    for batch in batches[1:]:
        record(decode_case(setup, runner, blocks, batch, contexts[0], steps, f"g{batch}x-"))
    record(prefill_case(runner, prefill, chunk, setup.config.vocab_size))
    record(prefill_case(runner, prefill, prefill, setup.config.vocab_size))
    del runner
    if device.type == "cuda":
        torch.cuda.empty_cache()
    eager = ModelRunner(setup.config, device=device, dtype=dtype, block_size=BLOCK, num_device_blocks=blocks,
                        num_cpu_blocks=0, attention="triton", cuda_graphs=False)
    for context in contexts:
        record(decode_case(setup, eager, blocks, 1, context, steps, f"e{context}-"))
    record(decode_case(setup, eager, blocks, batches[-1], contexts[0], steps, "e64x-"))
    return out


def _print(out: dict) -> None:
    print(f"\n{out['device']} · {out['shape']} {out['dtype']}")
    print("| case | wall ms | kernel ms | GPU busy | kernels | launch calls |\n|---|---:|---:|---:|---:|---:|")
    for c in out["cases"]:
        print(f"| {c['case']} | {c['wall_ms']:.2f} | {c['kernel_ms']:.2f} | {c['gpu_busy'] or 0:.0%} | "
              f"{c['kernels_per_step']} | {c['launch_calls_per_step']} |")
    for c in out["cases"]:
        if c["top_kernels"]:
            print(f"\n{c['case']}: " + "; ".join(f"{k['name'][:48]} {k['ms_per_step']:.3f} ms x{k['calls_per_step']:g}"
                                                for k in c["top_kernels"][:5]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load_tests.gpu_profile", allow_abbrev=False,
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny shape, fp32: the CPU dry run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; the CPU dry run is --device cpu --small", file=sys.stderr)
        return 2
    began = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f} s] {msg}", flush=True)

    out = run(device, args.small, say)
    _print(out)
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
