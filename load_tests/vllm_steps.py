"""Summarize the vLLM scheduler class's step logs (STREAMRAG_VLLM_STEP_LOG, one JSON line per step).

    streamrag bench steplog PREFIX.*.jsonl

Per file (one vLLM engine-core process = one service = one policy): steps, share of the token
budget used, tokens to complete and to partial prompts, steps where the class held requests back,
preemptions (ours and in total), and the largest queues (docs/vllm.md, "Our policies inside vLLM").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_bench_steplog_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, metavar="STEP_LOG", help="PREFIX.*.jsonl")
    parser.add_argument("--budget", type=int, default=256, help="the token budget of a full step")


def run_bench_steplog(args: argparse.Namespace) -> int:
    budget = args.budget
    for path in args.paths:
        steps = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        busy = [s for s in steps if s["requests"]]
        if not busy:
            print(f"{path}: no busy steps")
            continue
        tc = sum(s["tokens_complete"] for s in busy)
        tp = sum(s["tokens_partial"] for s in busy)
        print(f"{path}: {len(busy)} busy steps over {busy[-1]['t'] - busy[0]['t']:.0f} s; "
              f"budget used {100 * (tc + tp) / (budget * len(busy)):.0f}%; tokens complete {tc}, partial {tp}; "
              f"steps holding back {sum(1 for s in busy if s['held_running'] or s['held_waiting'])}; "
              f"preempted by the class {sum(s['preempted'] for s in steps)}, in total "
              f"{sum(s.get('preempted_total', 0) for s in steps)}; max running {max(s['running'] for s in steps)}, "
              f"waiting {max(s['waiting'] for s in steps)}, kv-holding {max(s['kv_holding'] for s in steps)}, "
              f"idle sessions {max(s['idle'] for s in steps)}; min free blocks {min(s['free_blocks'] for s in steps)}; "
              f"steps with a complete request not scheduled {sum(1 for s in busy if s['complete_not_scheduled'])}")

    return 0
