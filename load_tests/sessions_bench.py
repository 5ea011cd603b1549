"""`streamrag bench sessions`: time to first token of a session query as the session grows,
against Generate (cold), our prefix-cache path (warm Generate) and, when installed, vLLM's
prefix caching; Flash hits; ingestion throughput with and without queries running.

The real inference service runs as a subprocess on a loopback port (the service's defaults, dtype
`auto`: bf16 where the CPU has it) and everything goes through gRPC, as a client sees it. Per
seed, one session (instructions + a synthetic server log, deterministic per seed) grows to each
point of `--points` (tokens of head + data, default about 1k to 7.5k of SmolLM2's 8,192
positions). Growing to a point ingests the new data in two halves: one alone and one while a
thread asks session queries (which half comes first alternates by point), each timed from the
Ingest call until the session's state has computed every token (ingestion tokens/s). Then, once
the registered Flash question's answer for the new data version has arrived by Subscribe:

- `session_query_ttft_ms`: Sessions.Query, `max_tokens` 1, from sending the call to its first
  token; the median over `--questions` different questions;
- `flash_hit_ms`: Sessions.Query of the registered question (case and spacing varied), from
  sending to the answer, median over `--flash-repeats`; `flash_hit_server_ms` is the server's
  QueryDone.ttft_ms (its arrival at the server to its answer);
- `generate_ttft_ms` (cold): Inference.Generate on the same instructions + data + question
  segments, `max_tokens` 1, with the prefix cache defeated by a unique tag at the start of the
  instructions (a few tokens more than the session's context; `generate_prefix_hit_tokens`
  shows what the cache still matched: at most the chat prefix's first block);
- `prefix_cache_ttft_ms` (warm): Generate of that same context with a different question right
  after the cold one, median over `--warm-repeats` questions: the prefix-cache path;
- `vllm_prefix_cache_ttft_ms`: the same warm Generate against a `--backend vllm` service
  (its prefix caching) when `--vllm-python` has vllm (default /opt/vllm-venv), measured on the
  same contexts after the native runs.

Points are the median over seeds with the min-max spread (`_min`, `_max`); `runs` holds every
seed's measurements.

    streamrag bench sessions --json sessions.json

prints a markdown table and writes the JSON and a plot of TTFT against context size (beside the
JSON, `.png`, or `--plot`). Progress goes to stderr. This module is the command; its parts (the
workload, the client, one seed's run, the vLLM baseline, the summary and tables, the plot) are in
`load_tests/sessions/`.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from load_tests.runner import add_seeds_arg, positive_int_list, write_json
from load_tests.sessions.client import SessionsClient
from load_tests.sessions.plot import write_plot
from load_tests.sessions.seed_run import run_seed
from load_tests.sessions.summary import (
    combine,
    format_ingestion,
    format_ratios,
    format_table,
    ratios,
    summarize_ingestion,
)
from load_tests.sessions.vllm_baseline import vllm_prefix_cache
from load_tests.sessions.workload import INSTRUCTIONS, QUESTIONS
from servicekit.progress import say

# `streamrag bench sessions` (streamrag/cli.py) loads these two from here.
__all__ = ["add_bench_sessions_args", "run_bench_sessions"]

DEFAULT_POINTS = "1000,2000,4000,6000,7500"


def add_bench_sessions_args(parser: argparse.ArgumentParser) -> None:
    from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DTYPE_CHOICES

    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--points", type=positive_int_list, default=DEFAULT_POINTS,
                        help="context sizes (head + data tokens), comma-separated")
    add_seeds_arg(parser, what="data and question seeds")
    parser.add_argument("--questions", type=int, default=5, help="session queries per point (median)")
    parser.add_argument("--warm-repeats", type=int, default=3, help="warm Generates per point (median)")
    parser.add_argument("--flash-repeats", type=int, default=5, help="Flash hits per point (median)")
    parser.add_argument("--flash-max-tokens", type=int, default=8, help="the Flash question's answer length")
    parser.add_argument("--kv-device-blocks", type=int, default=2048)
    parser.add_argument("--vllm-python", default=str(Path("/opt/vllm-venv/bin/python")),
                        help="interpreter with vllm for the vLLM baseline (skipped when missing)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM baseline")
    parser.add_argument("--json", type=Path, default=None, help="write the points and runs here")
    parser.add_argument("--plot", type=Path, default=None, help="the TTFT plot (default: beside --json, .png)")


def run_bench_sessions(args: argparse.Namespace) -> int:
    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.factory import load_tokenizer
    from inference_svc.launch import start_inference_service
    from servicekit.hardware import resolve_dtype

    points, seeds = args.points, args.seeds
    if points != sorted(set(points)):
        raise SystemExit("--points must increase")
    if args.questions < 1 or args.warm_repeats < 1 or args.flash_repeats < 1:
        raise SystemExit("--questions, --warm-repeats and --flash-repeats must be >= 1")
    model_dir = Path(args.model or prepare_embedded_model(progress=False))
    dtype = args.resolved_dtype = resolve_dtype(args.dtype, args.device)   # what the service resolves "auto" to
    tokenizer = load_tokenizer(model_dir)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    say(f"sessions bench: {dtype}, points {points}, seeds {seeds}; starting the inference service")
    # A subprocess, as every benchmark's service: hosted in this process it would share the
    # interpreter with the client (docs/results.md, "Ours against vLLM").
    service = start_inference_service("native", model_dir, max_streams=64, policy=None, dtype=dtype,
                                      device=args.device, extra_args=["--kv-device-blocks", str(args.kv_device_blocks)])
    client = SessionsClient(service.address)
    rows: list[dict[str, Any]] = []
    ingestion_runs: list[dict[str, Any]] = []
    contexts: dict[tuple[int, int], list[str]] = {}
    started = time.perf_counter()

    def result(vllm_note: str | None = None) -> dict[str, Any]:
        points_out = combine(rows)
        out: dict[str, Any] = {
            "points": points_out,
            "ratios": ratios(points_out, rows) if rows else None,
            "ingestion": summarize_ingestion(ingestion_runs),
            "config": {"dtype": dtype, "device": args.device, "model": model_dir.name, "points": points,
                       "seeds": seeds, "questions": args.questions, "warm_repeats": args.warm_repeats,
                       "flash_repeats": args.flash_repeats, "flash_max_tokens": args.flash_max_tokens,
                       "max_tokens": 1, "cold_generate": "unique tag at the start of the instructions",
                       "cpu_count": os.cpu_count()},
            "runs": rows, "ingestion_runs": ingestion_runs,
        }
        if vllm_note:
            out["vllm_skipped"] = vllm_note
        return out

    try:
        client.generate(client.segments(INSTRUCTIONS, ["warm-up\n"], QUESTIONS[0]))     # lazy initialisation
        for seed in seeds:
            seed_rows, seed_ingestion, seed_contexts = run_seed(client, seed, points, args, count_tokens)
            rows.extend(seed_rows)
            ingestion_runs.extend(seed_ingestion)
            contexts.update({(seed, p): c for p, c in zip(points, seed_contexts, strict=True)})
            say(f"seed {seed} done ({time.perf_counter() - started:.0f}s)")
            if args.json:       # after every seed, so an interrupted benchmark keeps what it measured
                write_json(args.json, result())
    finally:
        client.close()
        service.stop()
    vllm_note = vllm_prefix_cache(args, model_dir, contexts, rows)
    if vllm_note:
        say(f"vLLM baseline skipped: {vllm_note}")
    out = result(vllm_note)
    print(format_table(out["points"]))
    print()
    print(format_ingestion(out["ingestion"]))
    print()
    print(format_ratios(out["ratios"]))
    if args.json:
        write_json(args.json, out)
    plot = args.plot or (args.json.with_suffix(".png") if args.json else None)
    if plot:
        write_plot(out["points"], plot, f"Session query vs Generate TTFT ({model_dir.name}, {dtype}, "
                                        f"{len(seeds)} seeds, {os.cpu_count()} CPUs)")
        say(f"plot: {plot}")
    return 0
