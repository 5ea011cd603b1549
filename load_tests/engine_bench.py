"""`streamrag bench engine`: raw prefill speed against transformers (and vLLM, one-shot, when vllm is
importable), and scheduler overhead.

Prints tables and writes JSON:
    {"prefill_tokens_per_s": {"native": {"512": x, ...}, "hf_transformers": {...}, "vllm": {...}},
     "prefill_chunked_tokens_per_s": {...same, prefill in 512-token chunks...},
     "scheduler_step_us": {"ordering": {"50": {"p50": x, "p99": x}, "500": {...}}, "step": {...}},
     "scheduler_step_us_by_policy": {policy: {...same shape...}}}
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DTYPE_CHOICES, POLICY_CHOICES
from load_tests.runner import positive_int, positive_int_list, write_json

POLICIES = POLICY_CHOICES
SIZES = "50,500"            # running requests the scheduler's overhead is measured at
SCHEDULER_STEPS = 300


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_bench_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--prompt-lengths", default="512,2048,4096")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--scheduler-sizes", type=positive_int_list, default=SIZES,
                        help=f"comma-separated running requests of the scheduler overhead (default: {SIZES})")
    parser.add_argument("--scheduler-steps", type=positive_int, default=SCHEDULER_STEPS,
                        help=f"scheduler steps timed at each size (default: {SCHEDULER_STEPS})")


def run_engine_bench(args: argparse.Namespace) -> int:
    import torch

    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.factory import DTYPES
    from load_tests.prefill_bench import format_table, measure_prefill_tokens_per_s
    from load_tests.scheduler_bench import measure_scheduler_us
    from servicekit.hardware import resolve_dtype

    model_dir = args.model or prepare_embedded_model(progress=False)
    lengths = [int(n) for n in args.prompt_lengths.split(",")]
    dtype = DTYPES[resolve_dtype(args.dtype, args.device)]
    results = measure_prefill_tokens_per_s(model_dir, prompt_lengths=lengths, dtype=dtype,
                                           device=args.device, repeats=args.repeats, progress=_say)
    from inference_svc.vllm_backend.config import vllm_available

    vllm_note = None
    if vllm_available():   # same prompts, in vLLM (spawns its engine process; the native runner is done)
        from load_tests.vllm_prefill_bench import measure_vllm_prefill

        results += measure_vllm_prefill(model_dir, lengths, dtype=args.dtype, device=args.device,
                                        repeats=args.repeats, progress=_say)
    else:
        vllm_note = "vllm not installed: no vLLM column (see docs/vllm.md)"
        _say(f"skipping vLLM prefill: {vllm_note}")
    names = {"streamrag": "native", "transformers": "hf_transformers"}
    one_shot: dict[str, dict[str, float]] = {}
    chunked: dict[str, dict[str, float]] = {}
    for r in results:
        target = one_shot if r.chunk_tokens is None else chunked
        target.setdefault(names.get(r.engine, r.engine), {})[str(r.prompt_tokens)] = round(r.tokens_per_s, 1)

    by_policy = {}
    for policy in POLICIES:
        _say(f"scheduler overhead: {policy}")
        per_size = {str(n): measure_scheduler_us(n, policy, steps=args.scheduler_steps) for n in args.scheduler_sizes}
        by_policy[policy] = {kind: {n: {k: round(v, 1) for k, v in per_size[n][kind].items()} for n in per_size}
                             for kind in ("ordering", "step")}
    report = {
        "model": str(model_dir), "device": args.device, "dtype": args.dtype,
        "torch_threads": torch.get_num_threads(),
        "prefill_tokens_per_s": one_shot,
        "prefill_chunked_tokens_per_s": chunked,
        **({"vllm_note": vllm_note} if vllm_note else {}),
        "scheduler_step_us": by_policy["lcas"],
        "scheduler_step_us_by_policy": by_policy,
    }
    print(f"\nPrefill tokens/s ({args.dtype}, {args.device}):")
    print(format_table(results))
    if vllm_note:
        print(f"({vllm_note})")
    print("\nScheduler overhead, microseconds (p50 / p99):")
    sizes = [str(n) for n in args.scheduler_sizes]
    print(f"{'policy':8s} " + " ".join(f"{k + ' ' + n:>22s}" for k in ("ordering", "step") for n in sizes))
    for policy, kinds in by_policy.items():
        cells = [f"{kinds[k][str(n)]['p50']:9.1f} / {kinds[k][str(n)]['p99']:9.1f}" for k in ("ordering", "step")
                 for n in args.scheduler_sizes]
        print(f"{policy:8s} " + " ".join(f"{c:>22s}" for c in cells))
    if args.json:
        write_json(args.json, report)
        print(f"\nwrote {args.json}")
    return 0
