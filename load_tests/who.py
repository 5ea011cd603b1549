"""Which requests' work ran while a slow request waited for its first token (a service's step log).

    streamrag bench who RUN_DIR STEP_LOG [--engine native|vllm] [--policy fcfs] [--top 5]
        [--ids anns-00028,...] [--mode streaming|non-streaming]

RUN_DIR is one `bench replay` run (its requests.jsonl); STEP_LOG is the step log
(inference_svc/engine/step_log.py: STREAMRAG_STEP_LOG on the native engine, STREAMRAG_VLLM_STEP_LOG
for our class in vLLM) of the service that served `--policy`'s replay on `--engine`: one JSON line
per step, each naming the requests it scheduled ("scheduled": id -> tokens) and the complete ones
among them ("complete"). Request ids hold the query id and the mode ("-s-<query>", "-ns-<query>").

The step log's clock (wall time) is aligned to the run's clock (seconds from the replay's start)
exactly when the run's summary.json records its start in wall time (`start_wall_s`, written since
session 12). Older runs are aligned by the earliest step that schedules each request:
offset = min(step time - the request's arrival). A query's first chunk comes after its arrival
(retrieval), so those aligned step times are early by the smallest such delay in the run (seconds on
ANNS): a step shown just before a request's last chunk may have run after it.
For each of the `--top` slowest requests of `--mode` (or `--ids`), it prints the steps between the
request's last chunk and its first token: the step's tokens by request, the waiting request's own
tokens marked with *, complete requests with "c".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path


def _query(rid: str, mode: str = "s") -> str | None:
    match = re.search(rf"-{mode}-([A-Za-z]+-\d+)", rid)
    return match.group(1) if match else None


def _recorded_start(run: Path, engine: str, policy: str, streaming: bool) -> float | None:
    """The wall-clock start of the run's replay on `engine` under `policy`, if the summary has it."""
    summary = run / "summary.json"
    if not summary.is_file():
        return None
    for config in json.loads(summary.read_text()).get("configs", []):
        if (config.get("engine") == engine and config.get("policy") == policy
                and config.get("streaming") == streaming):
            return config.get("start_wall_s")
    return None


def add_bench_who_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path)
    parser.add_argument("step_log", type=Path)
    parser.add_argument("--engine", choices=["native", "vllm"], default="vllm")
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--mode", choices=["streaming", "non-streaming"], default="streaming")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--ids", default=None, help="comma-separated query ids instead of the slowest")


def run_bench_who(args: argparse.Namespace) -> int:

    rows = [json.loads(line) for line in (args.run / "requests.jsonl").read_text().splitlines() if line.strip()]
    streaming = args.mode == "streaming"
    mode = "s" if streaming else "ns"
    rows = {r["query_id"]: r for r in rows
            if r["streaming"] == streaming and r["policy"] == args.policy and r["engine"] == args.engine}
    steps = [json.loads(line) for line in args.step_log.read_text().splitlines() if line.strip()]
    steps = [s for s in steps if s.get("scheduled")]
    first_seen: dict[str, float] = {}
    for s in steps:
        for rid in s["scheduled"]:
            q = _query(rid, mode)
            if q in rows and q not in first_seen:
                first_seen[q] = s["t"]
    if not first_seen:
        print("error: no request of the run appears in the step log (another run's log?)", file=sys.stderr)
        return 2
    offset = _recorded_start(args.run, args.engine, args.policy, streaming)
    if offset is None:
        offset = min(first_seen[q] - rows[q]["arrival_s"] for q in first_seen)
        print(f"(no start_wall_s in {args.run}/summary.json: aligned by first steps, early by the smallest "
              "first-chunk delay)")
    chosen = args.ids.split(",") if args.ids else sorted(rows, key=lambda q: -rows[q]["ttft_s"])[:args.top]
    for q in chosen:
        r = rows[q]
        start, end = offset + r["last_chunk_s"], offset + r["first_token_s"]
        window = [s for s in steps if start - 0.05 <= s["t"] <= end]
        by_request: dict[str, int] = defaultdict(int)
        print(f"\n{q}: {r['prompt_tokens']} tokens, {r['chunks']} chunks, TTFT {r['ttft_s']:.2f} s; "
              f"{len(window)} steps from its last chunk to its first token")
        for s in window:
            parts = []
            for rid, n in sorted(s["scheduled"].items(), key=lambda kv: -kv[1]):
                other = _query(rid, mode) or rid
                by_request[other] += n
                mark = "*" if other == q else ("c" if rid in s.get("complete", ()) else "")
                parts.append(f"{other}{mark}:{n}")
            print(f"  t={s['t'] - offset:7.2f}  " + " ".join(parts))
        total = sum(by_request.values())
        ranked = sorted(by_request.items(), key=lambda kv: -kv[1])
        print("  tokens in the window: " + ", ".join(f"{k} {v}" for k, v in ranked) + f" (total {total})")
    return 0
