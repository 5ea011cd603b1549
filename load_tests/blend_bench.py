"""`streamrag bench blend`: KV reuse of retrieved passages across requests and refinements
(blend mode, inference_svc/engine/chunk_store.py and blend.py) against exact mode.

Two parts, each over `--seeds` (default 0,1,2):

- **ANNS replay (update mode)**: `streamrag bench replay`'s run (load_tests.replay) on a native
  service per mode: streaming and non-streaming with `--kv-reuse exact`, streaming with
  `--kv-reuse blend`. `anns_p95_speedup_exact` is non-streaming p95 TTFT over streaming exact's,
  `anns_p95_speedup_blend` the same non-streaming (exact) p95 over streaming blend's. `tokens_computed`
  counts every prefilled token, reused ones included: blend's reuse is `blend_reused_tokens`, and the
  slowest blend requests (`slowest_blend`) show their refinement window (no window: nothing to reuse).
- **Across requests**: questions of load_tests/quality_questions.jsonl drawn with a Zipf skew; each
  question's passages are its answering page's first passages plus passages of a few popular pages
  (from a passage store), in a new order every time they are asked (retrievers rarely return the
  same order twice). Requests run one at a time on an in-process engine (the embedded model), in
  exact mode and in blend mode at each `--fractions` share: TTFT (open to first token, the prompt
  whole), whether the first 32 greedy tokens equal exact's, chunk-store hits per passage, and the
  share of reused tokens recomputed.

Writes OUT (JSON): the top-level figures at the default share (0.15) as the median over seeds, the
sweep (quality against speed per share), and per-seed rows; a plot beside it (OUT with .png).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from inference_svc.engine.options import DEFAULT_BLEND_RECOMPUTE, DEFAULT_DTYPE, DTYPE_CHOICES
from load_tests import runner

QUESTIONS = Path(__file__).with_name("quality_questions.jsonl")
FRACTIONS = (0.0, 0.05, 0.15, 0.3, 1.0)
AGREEMENT_TOKENS = 32
# ChatML of the embedded SmolLM2 model (what the orchestrator's prompt builds from Describe's chat format).
HEAD = "<|im_start|>system\nAnswer the question using the documents.<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"


# --- across requests ---------------------------------------------------------------------------

def zipf_draws(n_items: int, n_draws: int, s: float, rng: random.Random) -> list[int]:
    weights = [1.0 / (rank + 1) ** s for rank in range(n_items)]
    return rng.choices(range(n_items), weights=weights, k=n_draws)


def question_passages(store_path: Path, questions: list[dict], per_page: int, popular: int) -> tuple[dict, list]:
    """Each question's own passages (the first `per_page` of its answering pages) and a pool of `popular`
    passages shared by all (the first passages of the most asked-about pages)."""
    from retriever_svc.corpus.store import PassageStore

    store = PassageStore(store_path)
    by_page: dict[str, list] = {}
    for passage in store.all():
        by_page.setdefault(passage.url.split("#")[0], []).append(passage)
    own = {}
    for q in questions:
        passages = [p for page in q["pages"] for p in by_page.get(page, [])[:per_page]]
        own[q["id"]] = [(p.id, p.text) for p in passages[:per_page]]
    pages = sorted({page for q in questions for page in q["pages"]})
    pool = [(p.id, p.text) for page in pages[:popular] for p in by_page.get(page, [])[:1]]
    return own, pool


def make_requests(seed: int, n: int, zipf_s: float, own: dict, pool: list, questions: list[dict],
                  shared: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """(question, passages in this request's order) for `n` requests drawn with a Zipf skew."""
    rng = random.Random(seed)
    order = list(range(len(questions)))
    rng.shuffle(order)                        # which questions are popular depends on the seed
    requests = []
    for draw in zipf_draws(len(questions), n, zipf_s, rng):
        q = questions[order[draw]]
        docs = list(own[q["id"]]) + rng.sample(pool, min(shared, len(pool)))
        docs = list(dict.fromkeys(docs))
        rng.shuffle(docs)
        requests.append((q["question"], docs))
    return requests


def run_requests(engine: Any, requests: Sequence[tuple[str, list]], mode: str, fraction: float,
                 max_tokens: int) -> list[dict[str, Any]]:
    from inference_svc.engine.events import EventKind
    from inference_svc.engine.request import Segment
    from inference_svc.engine.sampler import SamplingParams

    rows = []
    for i, (question, docs) in enumerate(requests):
        rid = f"{mode}-{fraction}-{i}"
        sampling = SamplingParams(max_tokens=max_tokens, kv_reuse=mode,
                                  blend_recompute=fraction if mode == "blend" else None)
        started = time.perf_counter()
        engine.open(rid, [Segment(text=HEAD + question + "\nDocuments:\n")], sampling)
        engine.append(rid, [Segment(text=text + "\n", key=pid) for pid, text in docs])
        engine.finish(rid, [Segment(text=SUFFIX)])
        ttft, tokens = None, []
        while engine.has_unfinished():
            for event in engine.step():
                if event.request_id == rid and event.kind is EventKind.TOKEN:
                    if ttft is None:
                        ttft = time.perf_counter() - started
                    tokens.append(event.token_id)
        request = engine.release(rid)
        s = request.stats
        rows.append({"i": i, "ttft_s": ttft, "tokens": tokens, "prompt_tokens": request.num_prompt_tokens,
                     "reused": s.blend_reused_tokens, "recomputed": s.blend_recomputed_tokens,
                     "hits": s.chunk_cache_hits, "lookups": s.chunk_cache_lookups,
                     "prefix_hit_tokens": s.prefix_cache_hit_tokens})
    return rows


def cross_request(args: argparse.Namespace, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.engine import EngineConfig
    from inference_svc.engine.factory import EngineSpec, build_engine

    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    own, pool = question_passages(args.passages, questions, args.per_page, args.popular)
    requests = make_requests(seed, args.requests, args.zipf, own, pool, questions, args.shared)
    model = args.model or prepare_embedded_model(progress=False)

    def engine():
        return build_engine(EngineSpec(model_dir=Path(model), dtype=args.dtype, kv_device_blocks=args.kv_device_blocks,
                                       kv_cpu_blocks=args.kv_device_blocks,
                                       engine=EngineConfig(token_budget=args.token_budget,
                                                           step_time_target_ms=None)))

    say(f"[cross-request seed {seed}] exact: {len(requests)} requests")
    exact = run_requests(engine(), requests, "exact", 0.0, args.max_tokens)
    runs = {}
    for fraction in args.fractions:
        say(f"[cross-request seed {seed}] blend {fraction}")
        runs[fraction] = run_requests(engine(), requests, "blend", fraction, args.max_tokens)
    exact_ttft = statistics.fmean(r["ttft_s"] for r in exact)
    sweep = []
    for fraction, rows in runs.items():
        agree = sum(r["tokens"][:AGREEMENT_TOKENS] == e["tokens"][:AGREEMENT_TOKENS]
                    for r, e in zip(rows, exact, strict=True))
        reused = sum(r["reused"] for r in rows)
        sweep.append({
            "fraction": fraction,
            "ttft_mean_s": statistics.fmean(r["ttft_s"] for r in rows),
            "ttft_speedup": exact_ttft / statistics.fmean(r["ttft_s"] for r in rows),
            "ttft_p50_speedup": statistics.median(e["ttft_s"] for e in exact) / statistics.median(
                r["ttft_s"] for r in rows),
            "answer_agreement": agree / len(rows),
            "hit_rate": sum(r["hits"] for r in rows) / max(1, sum(r["lookups"] for r in rows)),
            "recompute_fraction": sum(r["recomputed"] for r in rows) / max(1, reused),
            "reused_share_of_prompt": reused / sum(r["prompt_tokens"] for r in rows),
        })
    return {"seed": seed, "exact_ttft_mean_s": exact_ttft,
            "exact_prefix_hit_share": sum(e["prefix_hit_tokens"] for e in exact) / sum(
                e["prompt_tokens"] for e in exact),
            "sweep": sweep}


# --- ANNS replay -------------------------------------------------------------------------------

def anns_replay(args: argparse.Namespace, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    import asyncio

    from inference_svc.launch import start_inference_service
    from load_tests.replay import _bench_on, add_bench_replay_args, service_flags, workloads_of
    from load_tests.replay_run import scale_query, stable_query
    from retriever_svc.replay.trace import read_trace

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_bench_replay_args(parser)
    rargs = parser.parse_args(["--trace", str(args.trace), "--qps", str(args.qps), "--seeds", str(seed),
                               "--token-budget", str(args.replay_token_budget), "--dtype", args.dtype,
                               "--out", "/tmp/unused"] + (["--max-queries", str(args.max_queries)]
                                                          if args.max_queries else []))
    rargs.seed = seed        # one seed's run (run_bench_replay sets it the same way for each of --seeds)
    trace = read_trace(args.trace)
    queries = [stable_query(scale_query(q, rargs.delay_multiplier)) for q in trace.queries]
    workloads = {w: qs[:args.max_queries] if args.max_queries else qs
                 for w, qs in workloads_of(queries).items() if w == "anns"}
    counter = iter(range(1, 1_000_000))
    salt = f"{seed:02d}{random.Random().randrange(100):02d}"
    results: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for mode, modes in (("exact", (True, False)), ("blend", (True,))):
        service = start_inference_service("native", args.model, policy="fcfs", dtype=args.dtype,
                                          extra_args=[*service_flags(rargs, "native", "cost"), "--kv-reuse", mode],
                                          metrics_port=0)
        configs: list[dict[str, Any]] = []
        mode_rows: list[dict[str, Any]] = []
        try:
            with open("/dev/null", "w") as sink:
                asyncio.run(_bench_on(service.address, workloads, rargs, lambda: f"{salt}-{next(counter):04d}", say,
                                      configs, mode_rows, sink, modes))
        finally:
            service.stop()
        rows += [{**row, "mode": mode} for row in mode_rows]
        for entry in configs:
            key = f"{mode}-{'s' if entry['streaming'] else 'ns'}"
            results[key] = {
                "ttft_s": entry["ttft_s"], "requests": entry["requests"], "failed": entry["failed"],
                "tokens_computed": entry["tokens_computed_total"], "prompt_tokens": entry["prompt_tokens_total"],
                "blend_reused_tokens": sum(r["blend_reused_tokens"] for r in mode_rows
                                           if r["streaming"] == entry["streaming"])}
    ns = results["exact-ns"]["ttft_s"]["p95"]
    return {"seed": seed, "runs": results,
            "p95_speedup_exact": ns / results["exact-s"]["ttft_s"]["p95"],
            "p95_speedup_blend": ns / results["blend-s"]["ttft_s"]["p95"],
            "slowest_blend": slowest(rows, workloads["anns"])}


def refine_window_s(query: Any) -> float:
    """Seconds from a query's first list to its final one: the time streaming has to prefill (and blend to
    fill the chunk store) before the last chunk. 0 for a query whose first list is already final."""
    return query.chunks[-1].t_s - query.chunks[0].t_s


def slowest(rows: Sequence[dict[str, Any]], queries: Sequence[Any], n: int = 3) -> list[dict[str, Any]]:
    """The `n` streaming blend requests with the longest TTFT (what sets the p95): their refinement window,
    prompt and the tokens they reused. A request whose window is ~0 had nothing prefilled before its last
    chunk, so nothing for blend to reuse (no earlier query brings its documents either)."""
    window = {q.query_id: refine_window_s(q) for q in queries}
    blend = [r for r in rows if r["mode"] == "blend" and r["streaming"] and r.get("ttft_s") is not None]
    return [{"query": r["query_id"], "ttft_s": round(r["ttft_s"], 3),
             "refine_window_s": round(window[r["query_id"]], 3), "prompt_tokens": r["prompt_tokens"],
             "blend_reused_tokens": r["blend_reused_tokens"]}
            for r in sorted(blend, key=lambda r: -r["ttft_s"])[:n]]


# --- the summary -------------------------------------------------------------------------------

def spread(values: Sequence[float]) -> dict[str, float]:
    """runner.spread, to 3 digits: the page shows no more."""
    return runner.spread(values, digits=3)


def reused_share(run: dict[str, Any]) -> float:
    """Of the tokens a replay run computed (every prefilled token, refinements' included), the share whose KV
    blend took from the chunk store (`tokens_computed` alone cannot tell blend's reuse apart)."""
    return run.get("blend_reused_tokens", 0) / max(1, run["tokens_computed"])


def summarize(args: argparse.Namespace, cross: list[dict], anns: list[dict]) -> dict[str, Any]:
    def at(fraction: float, key: str) -> list[float]:
        return [next(s[key] for s in run["sweep"] if s["fraction"] == fraction) for run in cross]

    default = DEFAULT_BLEND_RECOMPUTE if DEFAULT_BLEND_RECOMPUTE in args.fractions else args.fractions[0]
    out: dict[str, Any] = {}
    if anns:
        out["anns_p95_speedup_exact"] = spread([a["p95_speedup_exact"] for a in anns])["median"]
        out["anns_p95_speedup_blend"] = spread([a["p95_speedup_blend"] for a in anns])["median"]
    if cross:
        out["cross_request_ttft_speedup"] = spread(at(default, "ttft_speedup"))["median"]
        out["answer_agreement"] = spread(at(default, "answer_agreement"))["median"]
        out["hit_rate"] = spread(at(default, "hit_rate"))["median"]
        out["recompute_fraction"] = spread(at(default, "recompute_fraction"))["median"]
        out["sweep"] = [{"fraction": f, **{key: spread(at(f, key)) for key in
                                            ("ttft_speedup", "ttft_p50_speedup", "answer_agreement", "hit_rate",
                                             "recompute_fraction", "reused_share_of_prompt")}}
                        for f in args.fractions]
    if anns:
        out["anns"] = {"p95_speedup_exact": spread([a["p95_speedup_exact"] for a in anns]),
                       "p95_speedup_blend": spread([a["p95_speedup_blend"] for a in anns]),
                       "blend_reused_share": spread([reused_share(a["runs"]["blend-s"]) for a in anns]),
                       "per_seed": anns}
    out["meta"] = {"default_fraction": default, "seeds": args.seeds, "requests": args.requests, "zipf_s": args.zipf,
                   "max_tokens": args.max_tokens, "dtype": args.dtype, "token_budget": args.token_budget,
                   "trace": str(args.trace) if args.trace else None, "qps": args.qps,
                   "max_queries": args.max_queries, "created_unix": int(time.time())}
    out["cross_request_per_seed"] = cross
    return out


def plot(summary: dict[str, Any], path: Path) -> None:
    sweep = summary.get("sweep")
    if not sweep:
        return
    fig, ax = runner.pyplot().subplots(figsize=(5.5, 4))
    xs = [s["ttft_speedup"]["median"] for s in sweep]
    ys = [100 * s["answer_agreement"]["median"] for s in sweep]
    ax.plot(xs, ys, "o-")
    for s, x, y in zip(sweep, xs, ys, strict=True):
        ax.annotate(f"{s['fraction']:g}", (x, y), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("TTFT speedup over exact (mean TTFT ratio)")
    ax.set_ylabel(f"answers equal to exact's first {AGREEMENT_TOKENS} tokens (%)")
    ax.set_title("blend: recomputed share (labels), quality vs speed")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    runner.save_figure(fig, path, dpi=120)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="summary JSON to write (a .png plot beside it)")
    runner.add_seeds_arg(parser)
    parser.add_argument("--parts", default="cross,anns", help="comma-separated: cross (across requests), anns")
    parser.add_argument("--passages", type=Path, default=None,
                        help="passage store the questions' passages come from (default: the bundled index's; "
                             "`streamrag bench paper traces --passages FILE` makes one without embeddings)")
    parser.add_argument("--requests", type=int, default=30, help="requests per run (across requests)")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the question draws")
    parser.add_argument("--per-page", type=int, default=3, help="passages of a question's answering page")
    parser.add_argument("--popular", type=int, default=8, help="popular passages shared by every question")
    parser.add_argument("--shared", type=int, default=2, help="popular passages in each request")
    parser.add_argument("--fractions", type=runner.fraction_list, default=list(FRACTIONS),
                        help="comma-separated recomputed shares")
    parser.add_argument("--max-tokens", type=int, default=AGREEMENT_TOKENS)
    parser.add_argument("--token-budget", type=int, default=2048)
    parser.add_argument("--kv-device-blocks", type=int, default=1024)
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--trace", type=Path, default=None, help="ANNS trace (streamrag trace synth --workload anns)")
    parser.add_argument("--qps", type=float, default=0.333)
    parser.add_argument("--max-queries", type=int, default=None)
    parser.add_argument("--replay-token-budget", type=int, default=256)


def run(args: argparse.Namespace) -> int:
    from retriever_svc.corpus.index import default_index_dir
    from servicekit.progress import say

    parts = set(args.parts.split(","))
    if "anns" in parts and args.trace is None:
        raise SystemExit("error: the anns part needs --trace (streamrag trace synth --workload anns)")
    args.passages = args.passages or default_index_dir() / "passages.sqlite"
    if "cross" in parts and not Path(args.passages).exists():
        raise SystemExit(f"error: no passage store at {args.passages} (--passages FILE)")
    cross, anns = [], []
    for seed in args.seeds:
        if "cross" in parts:
            cross.append(cross_request(args, seed, say))
        if "anns" in parts:
            anns.append(anns_replay(args, seed, say))
    summary = summarize(args, cross, anns)
    runner.write_json(args.json, summary)
    plot(summary, args.json.with_suffix(".png"))
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, (list, dict))}, indent=1))
    return 0
