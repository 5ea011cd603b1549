"""`streamrag bench paper STEP... --out DIR --seeds 0,1,2`: the Stream2LLM evaluation (paper section 6) on this machine.

Each step is one `streamrag bench replay` over one of the synthesized traces, run for every seed
(`DIR/STEP/seed-S`, combined in `DIR/STEP/seeds.json` and `seeds.md` with the ratios between
configurations: load_tests/replay_seeds.py). The traces are synthesized into DIR first where
missing (`streamrag trace synth`, from the default index's passages or from `--passages FILE`; a
missing FILE is written first, the Python docs split into passages without embedding them).

Scaling (docs/results.md, "How to read it"): tokens x0.05 and time x3 keep the paper's ratios of
prefill time to retrieval time and of step time to chunk gap on this CPU and the embedded model;
the QPS levels are the paper's divided by 3 (same utilisation); the token budget per step is the
paper's 2048-8192 x 0.05, a block multiple. Native steps run the product's defaults (fcfs, cost
eviction); the vLLM steps start vLLM services through `--vllm-python` (docs/vllm.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from load_tests.runner import add_seeds_arg


class Trace(NamedTuple):
    workload: str
    queries: int
    time_scale: float
    token_scale: float
    seed: int


# The traces the steps replay, by file name in DIR.
TRACES = {
    "crawler.jsonl": Trace("crawler", 30, 3, 0.05, 1),
    "anns.jsonl": Trace("anns", 30, 3, 0.05, 1),
    # 120 queries: at high load the arrivals must outlast a query's 30 s retrieval (steady state)
    "crawler-120.jsonl": Trace("crawler", 120, 3, 0.05, 2),
    # the same queries at the paper's own timing (time x1): the paper's QPS 4 saturates this CPU with it
    "crawler-120-t1.jsonl": Trace("crawler", 120, 1, 0.05, 2),
    # sensitivity: ANNS refinement windows 3.3x longer against a step
    "anns-t10.jsonl": Trace("anns", 30, 10, 0.05, 1),
    # the synthesizer's default scales (token scale 0.1, the paper's timing)
    "crawler-default.jsonl": Trace("crawler", 30, 1, 0.1, 1),
}

NATIVE = ["--policies", "fcfs", "--eviction", "cost"]
VLLM_PAIR = ["--engine", "vllm", "--policies", "default,fcfs"]
EVERY_POLICY = ["--policies", "default,fcfs,lcas,mcps", "--eviction", "recompute,swap,cost"]

# step: (trace, replay flags), each QPS the paper's divided by 3 (the paper's in the comment)
STEPS = {
    "crawler": ("crawler.jsonl", ["--qps", "0.167", "--qps", "0.333", "--qps", "0.667", *NATIVE]),   # 0.5, 1, 2
    "crawler-high": ("crawler-120.jsonl", ["--qps", "1.333", *NATIVE]),                             # 4
    "anns": ("anns.jsonl", ["--qps", "0.167", "--qps", "0.333", "--qps", "0.667", *NATIVE]),         # 0.5, 1, 2
    "anns-t10": ("anns-t10.jsonl", ["--qps", "0.2", *NATIVE]),                                       # 2
    # memory pressure: a KV pool below the resident peak; ANNS with gaps x10
    "pressure-crawler": ("crawler.jsonl", ["--qps", "1.333", "--kv-device-blocks", "256", *EVERY_POLICY]),
    "pressure-anns": ("anns.jsonl", ["--qps", "0.667", "--kv-device-blocks", "160", "--delay-multiplier", "10",
                                     *EVERY_POLICY]),
    # ours against vLLM: our engine and our class inside vLLM against vLLM-S and vLLM-NS
    "peer08": ("crawler-default.jsonl", ["--qps", "0.8", "--engine", "native,vllm", "--policies", "default,fcfs"]),
    "peer-t1": ("crawler-120-t1.jsonl", ["--qps", "4", "--qps", "8", *VLLM_PAIR]),   # the paper's timing: 4, 8
    "anns-vllm": ("anns.jsonl", ["--qps", "0.167", "--qps", "0.333", "--qps", "0.667", *VLLM_PAIR]),
    "pressure-vllm": ("crawler.jsonl", ["--qps", "1.333", "--kv-device-blocks", "66", "--vllm-block-size", "128",
                                        "--engine", "vllm", "--policies", "fcfs", "--request-timeout", "200"]),
}
COMMON = ["--token-budget", "256", "--dtype", "auto"]   # auto: bf16 where the CPU has it, else fp32


def write_passages(path: Path) -> None:
    """The Python docs extracted and split into a passage store, without embeddings or DiskANN: what
    `trace synth --passages` reads, in about half a minute instead of the full index's embedding time."""
    from retriever_svc.corpus import index as ix
    from retriever_svc.corpus.store import write_store

    path.parent.mkdir(parents=True, exist_ok=True)
    params, src, count = ix.BuildParams(), ix.DEFAULT_SOURCE, ix.token_counter()
    passages = []
    files = ix.html_files(src)
    for p in files:
        page = ix.extract_html(p.read_text(encoding="utf-8", errors="replace"), p.relative_to(src).as_posix())
        passages.extend(ix.split_page(page, params.max_tokens, count))
    print(len(files), "pages ->", write_store(path, passages, {"note": "passages only"}), "passages")


def synth_argv(name: str, out: Path, passages: Path | None) -> list[str]:
    t = TRACES[name]
    return ["--workload", t.workload, "--queries", str(t.queries), "--token-scale", str(t.token_scale),
            "--time-scale", str(t.time_scale), "--seed", str(t.seed), "--out", str(out / name),
            *(["--passages", str(passages)] if passages else [])]


def replay_argv(step: str, out: Path, seeds: list[int]) -> list[str]:
    trace, flags = STEPS[step]
    return ["--trace", str(out / trace), *flags, *COMMON, "--seeds", ",".join(map(str, seeds)),
            "--out", str(out / step)]


def _run(add_args: Callable[[argparse.ArgumentParser], None], run: Callable[[argparse.Namespace], int],
         argv: list[str], prog: str) -> int:
    """A command's own flags and handler, as the CLI would call them (this process keeps the CPU lock)."""
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    add_args(parser)
    return run(parser.parse_args(argv))


def add_bench_paper_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("steps", nargs="+", choices=[*STEPS, "traces"], metavar="STEP",
                        help=f"what to run: {', '.join(STEPS)}; traces only synthesizes the traces")
    parser.add_argument("--out", type=Path, default=Path("out/paper"), help="traces and runs (default: out/paper)")
    parser.add_argument("--passages", type=Path, default=None,
                        help="passages.sqlite the traces draw documents from (written without embeddings if "
                             "missing; default: the default index's store)")
    add_seeds_arg(parser, what="Poisson-arrival seeds of every step")


def run_bench_paper(args: argparse.Namespace) -> int:
    from load_tests.replay import add_bench_replay_args, run_bench_replay
    from load_tests.trace_synth import add_trace_synth_args, run_trace_synth

    if args.passages and not args.passages.exists():
        write_passages(args.passages)
    needed = set(TRACES) if "traces" in args.steps else {STEPS[s][0] for s in args.steps}
    for name in sorted(needed):
        if not (args.out / name).exists():
            print(f"== trace {name}", file=sys.stderr)
            if _run(add_trace_synth_args, run_trace_synth, synth_argv(name, args.out, args.passages),
                    "streamrag trace synth"):
                return 1
    failed = 0
    for step in (s for s in args.steps if s in STEPS):
        print(f"== {step}, seeds {','.join(map(str, args.seeds))}", file=sys.stderr)
        failed |= _run(add_bench_replay_args, run_bench_replay, replay_argv(step, args.out, args.seeds),
                       "streamrag bench replay")
    return 1 if failed else 0
