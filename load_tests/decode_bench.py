"""`streamrag bench decode`: decode speed with speculative decoding off, at fixed depths and auto.

Workloads (greedy, up to `--max-tokens` tokens per answer):
- `rag`: questions from load_tests/quality_questions.jsonl over their answering page of the Python
  docs (the three passages sharing most words with the question), in the orchestrator's prompt
  (orchestrator/prompt.py): answers that quote their context;
- `free`: open-ended prompts with no context to quote.

For each seed (which questions, and their order), concurrency and mode, the requests start
together in one in-process engine (the service's defaults, bf16 where the CPU has it); prefill
is excluded: the clock starts when every request has its first token. Reported per row: decode
tokens/s (tokens after the first / decode wall time), inter-token latency p50/p95 (ms, between
consecutive tokens of a request: tokens accepted in one step arrive together), draft acceptance
(accepted / drafted), and the time to the whole answer at concurrency 1. Rows are the median
over seeds with the min-max spread. The prompts' KV stays in the prefix cache between modes, so
later modes prefill little: prefill is not measured anyway.

    flock /tmp/streamrag-cpu.lock python -m load_tests.decode_bench --json decode.json

writes `{"rows": [{"workload", "concurrency", "mode", "tokens_per_s", "itl_p50_ms", "itl_p95_ms",
"acceptance", ...}], "runs": [...per seed...]}` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

QUESTIONS = Path(__file__).with_name("quality_questions.jsonl")
DOCS_ROOT = Path("/usr/share/doc/python3.11/html")
FREE_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe your ideal weekend in the mountains.",
    "Explain why the sky changes colour at sunset, as if to a child.",
    "Write a letter to a friend about learning to cook.",
    "Invent a new board game and explain how to win it.",
    "Describe a busy market in a city you imagine.",
    "Write a poem about autumn rain.",
    "Tell the story of a robot who wants to become a gardener.",
    "Describe the life of a honeybee over one summer day.",
    "Write a speech for the opening of a small village library.",
    "Explain how you would plan a trip around the world on a small budget.",
    "Describe a dream about flying over an ocean.",
    "Write a diary entry of a cat watching birds from a window.",
    "Tell a fable about a fox, a crow and a river.",
    "Describe a train journey through snowy forests.",
    "Write a short mystery set in an old bookshop.",
)
MODES = ("off", "2", "4", "8", "auto")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Prompt:
    segments: list          # engine Segments: head + documents + suffix


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]{3,}", text.lower()))


def rag_prompts(chat, count: int, rng: random.Random) -> list[Prompt]:
    from inference_svc.convert import segments_from_proto
    from orchestrator.prompt import document_segment, head_segments, suffix_segments
    from protos import common_pb2
    from retriever_svc.corpus.extract import extract_html
    from retriever_svc.corpus.passages import split_page

    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    rng.shuffle(questions)
    prompts = []
    for q in questions:
        page_path = DOCS_ROOT / q["pages"][0]
        if not page_path.exists():
            continue
        passages = split_page(extract_html(page_path.read_text(errors="replace"), q["pages"][0]))
        wanted = _words(q["question"])
        best = sorted(passages, key=lambda p: -len(wanted & _words(p.text)))[:3]
        docs = [document_segment(common_pb2.Document(id=p.id, title=p.title, url=p.url, text=p.text)) for p in best]
        segments = head_segments(chat, q["question"]) + docs + suffix_segments(chat, q["question"])
        prompts.append(Prompt(segments_from_proto(segments)))
        if len(prompts) == count:
            break
    return prompts


def free_prompts(chat, count: int, rng: random.Random) -> list[Prompt]:
    from inference_svc.engine.request import Segment

    texts = list(FREE_PROMPTS)
    rng.shuffle(texts)
    return [Prompt([Segment(text=chat.prompt_prefix + chat.user_prefix + text + chat.user_suffix
                            + chat.assistant_prefix)]) for text in (texts * 4)[:count]]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_once(engine, prompts: list[Prompt], mode: str, max_tokens: int, tag: str) -> dict[str, Any]:
    """All prompts at once; decode tokens/s from the moment every request has its first token."""
    from inference_svc.engine.events import EventKind
    from inference_svc.engine.sampler import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, speculation=mode)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.open(rid, prompt.segments, params)
        engine.finish(rid)
    token_times: dict[str, list[float]] = {rid: [] for rid in ids}
    opened = time.perf_counter()
    decode_start = None
    drafted0, accepted0 = engine.counters.draft_tokens, engine.counters.accepted_draft_tokens
    while engine.has_unfinished():
        events = engine.step()
        now = time.perf_counter()
        for event in events:
            if event.kind is EventKind.TOKEN:
                token_times[event.request_id].append(now)
        if decode_start is None and all(token_times[rid] for rid in ids):
            decode_start = now
            drafted0, accepted0 = engine.counters.draft_tokens, engine.counters.accepted_draft_tokens
    end = time.perf_counter()
    decode_start = decode_start or end
    decode_tokens = sum(sum(1 for t in times if t > decode_start) for times in token_times.values())
    itls = [(b - a) * 1e3 for times in token_times.values() for a, b in itertools.pairwise(times)]
    drafted = engine.counters.draft_tokens - drafted0
    accepted = engine.counters.accepted_draft_tokens - accepted0
    answer_s = [times[-1] - opened for times in token_times.values() if times]
    for rid in ids:
        engine.release(rid)
    return {"tokens_per_s": decode_tokens / max(end - decode_start, 1e-9),
            "itl_p50_ms": _percentile(itls, 0.5), "itl_p95_ms": _percentile(itls, 0.95),
            "acceptance": accepted / drafted if drafted else 0.0,
            "answer_tokens": statistics.mean(len(t) for t in token_times.values()),
            "answer_s": statistics.median(answer_s)}


def _combine(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    grouped: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["workload"], run["concurrency"], run["mode"]), []).append(run)
    rows = []
    for (workload, concurrency, mode), group in grouped.items():
        row: dict[str, Any] = {"workload": workload, "concurrency": concurrency, "mode": mode, "seeds": len(group)}
        for key in ("tokens_per_s", "itl_p50_ms", "itl_p95_ms", "acceptance", "answer_tokens", "answer_s"):
            values = [r[key] for r in group]
            row[key] = statistics.median(values)
            row[f"{key}_min"], row[f"{key}_max"] = min(values), max(values)
        rows.append(row)
    for row in rows:
        off = next((r for r in rows if r["workload"] == row["workload"] and r["concurrency"] == row["concurrency"]
                    and r["mode"] == "off"), None)
        row["speedup_vs_off"] = row["tokens_per_s"] / off["tokens_per_s"] if off else None
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | concurrency | mode | decode tok/s | vs off | ITL p50 ms | ITL p95 ms | acceptance "
             "| answer tokens | time to answer s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {r['mode']} | {r['tokens_per_s']:.1f} "
            f"({r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f}) | "
            f"{'-' if r['speedup_vs_off'] is None else format(r['speedup_vs_off'], '.2f') + 'x'} "
            f"| {r['itl_p50_ms']:.0f} | {r['itl_p95_ms']:.0f} | {r['acceptance']:.2f} | {r['answer_tokens']:.0f} "
            f"| {r['answer_s']:.2f} |")
    return "\n".join(lines)


def add_bench_decode_args(parser: argparse.ArgumentParser) -> None:
    from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DTYPE_CHOICES

    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--workloads", default="rag,free")
    parser.add_argument("--concurrency", default="1,8", help="requests decoding together, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help="speculation settings, comma-separated")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-budget", type=int, default=None, help="engine draft budget (default: the engine's)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")


def run_bench_decode(args: argparse.Namespace) -> int:
    from inference_svc.chat_format import chat_format
    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.factory import EngineSpec, build_engine
    from inference_svc.engine.options import parse_speculation

    modes = args.modes.split(",")
    for mode in modes:
        parse_speculation(mode)
    model_dir = args.model or prepare_embedded_model(progress=False)
    spec = EngineSpec(Path(model_dir), device=args.device, dtype=args.dtype, kv_device_blocks=4096)
    if args.draft_budget is not None:
        spec = replace(spec, engine=replace(spec.engine, draft_budget=args.draft_budget))
    engine = build_engine(spec)
    chat = chat_format(engine.tokenizer.tokenizer, tuple(engine.runner.eos_token_ids))
    makers = {"rag": rag_prompts, "free": free_prompts}
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    runs = []
    _say(f"decode bench: {spec.dtype}, modes {modes}, concurrency {concurrencies}, seeds {args.seeds}")
    for seed in (int(s) for s in args.seeds.split(",")):
        for workload in args.workloads.split(","):
            prompts = makers[workload](chat, max(concurrencies), random.Random(seed))
            for concurrency in concurrencies:
                for mode in modes:
                    started = time.perf_counter()
                    result = run_once(engine, prompts[:concurrency], mode, args.max_tokens,
                                      f"s{seed}-{workload}-c{concurrency}-{mode}")
                    result.update(seed=seed, workload=workload, concurrency=concurrency, mode=mode)
                    runs.append(result)
                    _say(f"seed {seed} {workload} c={concurrency} {mode:>4}: {result['tokens_per_s']:6.1f} tok/s "
                         f"acceptance {result['acceptance']:.2f} answer {result['answer_tokens']:.0f} tokens "
                         f"({time.perf_counter() - started:.1f}s)")
                    if args.json:   # after every run, so an interrupted benchmark keeps what it measured
                        args.json.write_text(json.dumps({"rows": _combine(runs), "runs": runs}, indent=2))
    rows = _combine(runs)
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "runs": runs}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_decode_args(parser)
    return run_bench_decode(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
