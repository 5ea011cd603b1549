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

    streamrag bench decode --json decode.json

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
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from load_tests.runner import add_seeds_arg, positive_int_list, write_json
from servicekit.progress import say

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



@dataclass(frozen=True)
class Prompt:
    segments: list          # engine Segments: head + documents + suffix


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]{3,}", text.lower()))


def rag_prompts(chat, count: int, rng: random.Random) -> list[Prompt]:
    from inference_svc.rpc.convert import segments_from_proto
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
    steps: list[tuple[float, int, int, list[int]]] = []   # decode steps: (ms, tokens computed, drafted, depths)
    while engine.has_unfinished():
        step_start = time.perf_counter()
        events = engine.step()
        now = time.perf_counter()
        if decode_start is not None:
            last = engine.last_step
            steps.append(((now - step_start) * 1e3, last.tokens, last.draft_tokens, list(last.depths)))
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
    depths = [d for step in steps for d in step[3]]
    plain = [ms for ms, _, drafted_now, _ in steps if drafted_now == 0]
    return {"steps": len(steps), "step_ms": statistics.mean(s[0] for s in steps) if steps else 0.0,
            "plain_step_ms": statistics.median(plain) if plain else 0.0,
            "tokens_per_step": statistics.mean(s[1] for s in steps) if steps else 0.0,
            "draft_per_step": statistics.mean(s[2] for s in steps) if steps else 0.0,
            "mean_depth": statistics.mean(depths) if depths else 0.0,
            "emitted_per_step": decode_tokens / len(steps) if steps else 0.0,
            "step_profile": [[round(ms, 2), tokens, drafted_now] for ms, tokens, drafted_now, _ in steps],
"tokens_per_s": decode_tokens / max(end - decode_start, 1e-9),
            "itl_p50_ms": _percentile(itls, 0.5), "itl_p95_ms": _percentile(itls, 0.95),
            "acceptance": accepted / drafted if drafted else 0.0,
            "answer_tokens": statistics.mean(len(t) for t in token_times.values()),
            "answer_s": statistics.median(answer_s)}


PER_RUN_KEYS = ("tokens_per_s", "itl_p50_ms", "itl_p95_ms", "acceptance", "answer_tokens", "answer_s",
                "steps", "step_ms", "plain_step_ms", "tokens_per_step", "draft_per_step", "mean_depth",
                "emitted_per_step", "speedup_vs_off")


def _combine(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows: median over seeds with min-max. `speedup_vs_off` is each seed's tokens/s over the same
    seed's `off` (same prompts, same process, minutes apart), then the median and spread of those."""
    offs = {(r["seed"], r["workload"], r["concurrency"]): r["tokens_per_s"] for r in runs if r["mode"] == "off"}
    grouped: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        off = offs.get((run["seed"], run["workload"], run["concurrency"]))
        run["speedup_vs_off"] = run["tokens_per_s"] / off if off else None
        grouped.setdefault((run["workload"], run["concurrency"], run["mode"]), []).append(run)
    rows = []
    for (workload, concurrency, mode), group in grouped.items():
        row: dict[str, Any] = {"workload": workload, "concurrency": concurrency, "mode": mode, "seeds": len(group)}
        for key in PER_RUN_KEYS:
            values = [r[key] for r in group if r.get(key) is not None]
            if not values:
                row[key] = row[f"{key}_min"] = row[f"{key}_max"] = None
                continue
            row[key] = statistics.median(values)
            row[f"{key}_min"], row[f"{key}_max"] = min(values), max(values)
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | concurrency | mode | decode tok/s | vs off | ITL p50 ms | ITL p95 ms | acceptance "
             "| mean depth | decode steps | step ms | answer tokens | time to answer s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {r['mode']} | {r['tokens_per_s']:.1f} "
            f"({r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f}) | "
            f"{'-' if r['speedup_vs_off'] is None else format(r['speedup_vs_off'], '.2f') + 'x'} "
            f"({'-' if r['speedup_vs_off'] is None else format(r['speedup_vs_off_min'], '.2f')}-"
            f"{'-' if r['speedup_vs_off'] is None else format(r['speedup_vs_off_max'], '.2f')}) "
            f"| {r['itl_p50_ms']:.0f} | {r['itl_p95_ms']:.0f} | {r['acceptance']:.2f} | {r['mean_depth']:.1f} "
            f"| {r['steps']:.0f} | {r['step_ms']:.0f} | {r['answer_tokens']:.0f} "
            f"| {r['answer_s']:.2f} |")
    return "\n".join(lines)


def measure_verify_cost(runner, context: int, batches: list[int], depths: list[int], repeats: int = 7
                        ) -> list[dict[str, Any]]:
    """The runner's step time with `batch` sequences of `context` cached tokens each computing 1 + k
    tokens (a verification of k drafted tokens; k = 0 is a plain decode step), median of `repeats`,
    and its ratio to the plain step: what `DepthSettings.cost_ratio` estimates (per draft token)."""
    import torch

    from inference_svc.engine.model_runner import ChunkInput

    bs = runner.block_size
    per_seq = -(-(context + max(depths) + 1) // bs)
    if per_seq * max(batches) > runner.kv_cache.num_device_blocks:
        raise ValueError("the KV pool is too small for this verify-cost measurement")
    gen = torch.Generator().manual_seed(0)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(max(batches))]
    for table in tables:      # the context's KV, computed once
        ids = torch.randint(0, runner.config.vocab_size, (context,), generator=gen).tolist()
        runner.execute([ChunkInput(ids, 0, table, False)])
    results = []
    for batch in batches:
        plain_ms = None
        for k in sorted(depths):
            chunks = [ChunkInput(torch.randint(0, runner.config.vocab_size, (k + 1,), generator=gen).tolist(),
                                 context, tables[i], True, k + 1) for i in range(batch)]
            runner.execute(chunks)   # warm-up, untimed
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                runner.execute(chunks)
                times.append((time.perf_counter() - started) * 1e3)
            ms = statistics.median(times)
            plain_ms = ms if k == 0 else plain_ms
            row = {"batch": batch, "context": context, "k": k, "step_ms": ms, "step_ms_min": min(times),
                   "step_ms_max": max(times), "vs_plain": ms / plain_ms if plain_ms else None,
                   "per_draft_token": (ms / plain_ms - 1) / k if plain_ms and k else None}
            results.append(row)
            say(f"verify cost: batch {batch} context {context} k={k}: {ms:7.1f} ms "
                 f"({row['vs_plain'] or 1:.2f}x plain)")
    return results


def fit_step_cost(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Least-squares step time = fixed + per_token * tokens computed, over `measure_verify_cost`'s rows."""
    xs = [r["batch"] * (1 + r["k"]) for r in rows]
    ys = [r["step_ms"] for r in rows]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def add_bench_decode_args(parser: argparse.ArgumentParser) -> None:
    from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DTYPE_CHOICES

    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--workloads", default="rag,free")
    parser.add_argument("--concurrency", type=positive_int_list, default="1,8",
                        help="requests decoding together, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help="speculation settings, comma-separated")
    add_seeds_arg(parser)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-budget", type=int, default=None, help="engine draft budget (default: the engine's)")
    parser.add_argument("--cost-ratio", type=float, default=None,
                        help="auto depth's DepthSettings.cost_ratio (default: the engine's); "
                             "`--verify-cost` measures it")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--verify-cost", action="store_true",
                        help="instead: time a step verifying k drafted tokens against a plain decode step "
                             "(batches --concurrency, depths 0 and --modes' fixed k, --verify-context tokens cached)")
    parser.add_argument("--verify-context", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's, one per core); "
                             "1 is steadier on a shared machine")


def run_bench_decode(args: argparse.Namespace) -> int:
    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.factory import EngineSpec, build_engine
    from inference_svc.engine.options import parse_speculation
    from inference_svc.rpc.chat_format import chat_format

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    modes = args.modes.split(",")
    for mode in modes:
        parse_speculation(mode)
    model_dir = args.model or prepare_embedded_model(progress=False)
    spec = EngineSpec(Path(model_dir), device=args.device, dtype=args.dtype, kv_device_blocks=4096)
    if args.draft_budget is not None:
        spec = replace(spec, engine=replace(spec.engine, draft_budget=args.draft_budget))
    if args.cost_ratio is not None:
        spec = replace(spec, engine=replace(spec.engine, depth_settings=replace(spec.engine.depth_settings,
                                                                                cost_ratio=args.cost_ratio)))
    engine = build_engine(spec)
    if args.verify_cost:
        depths = sorted({0} | {parse_speculation(m) for m in modes if parse_speculation(m)})
        cost = measure_verify_cost(engine.runner, args.verify_context,
                                   args.concurrency, depths)
        print("| batch | context | k | step ms (min-max) | vs plain step | per draft token |")
        print("|---:|---:|---:|---|---:|---:|")
        for r in cost:
            print(f"| {r['batch']} | {r['context']} | {r['k']} | {r['step_ms']:.1f} ({r['step_ms_min']:.1f}-"
                  f"{r['step_ms_max']:.1f}) | {r['vs_plain']:.2f}x | "
                  f"{'-' if r['per_draft_token'] is None else format(r['per_draft_token'], '.3f')} |")
        fixed_ms, per_token_ms = fit_step_cost(cost)
        print(f"step time ~ {fixed_ms:.2f} ms + {per_token_ms:.3f} ms per computed token: "
              f"cost_ratio (one more token / a step's fixed cost) = {per_token_ms / fixed_ms:.4f}")
        if args.json:
            write_json(args.json, {"verify_cost": cost, "fixed_ms": fixed_ms, "per_token_ms": per_token_ms,
                                   "cost_ratio": per_token_ms / fixed_ms})
        return 0
    chat = chat_format(engine.tokenizer.tokenizer, tuple(engine.runner.eos_token_ids))
    makers = {"rag": rag_prompts, "free": free_prompts}
    concurrencies = args.concurrency
    runs = []
    say(f"decode bench: {spec.dtype}, modes {modes}, concurrency {concurrencies}, seeds {args.seeds}")
    for seed in args.seeds:
        for workload in args.workloads.split(","):
            prompts = makers[workload](chat, max(concurrencies), random.Random(seed))
            for concurrency in concurrencies:
                for mode in modes:
                    started = time.perf_counter()
                    result = run_once(engine, prompts[:concurrency], mode, args.max_tokens,
                                      f"s{seed}-{workload}-c{concurrency}-{mode}")
                    result.update(seed=seed, workload=workload, concurrency=concurrency, mode=mode)
                    runs.append(result)
                    say(f"seed {seed} {workload} c={concurrency} {mode:>4}: {result['tokens_per_s']:6.1f} tok/s "
                         f"acceptance {result['acceptance']:.2f} answer {result['answer_tokens']:.0f} tokens "
                         f"({time.perf_counter() - started:.1f}s)")
                    if args.json:   # after every run, so an interrupted benchmark keeps what it measured
                        write_json(args.json, {"rows": _combine(runs), "runs": runs})
    rows = _combine(runs)
    print(format_table(rows))
    if args.json:
        write_json(args.json, {"rows": rows, "runs": runs})
    return 0
