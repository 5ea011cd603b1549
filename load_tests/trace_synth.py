"""`streamrag trace synth`: the command line of the trace synthesizer (`load_tests.synth`).

    streamrag trace synth --workload crawler|anns --out traces/crawler.jsonl \\
        [--queries 200] [--token-scale 0.1] [--time-scale 1] [--seed 0] [--passages FILE]

Writes a trace calibrated to the Stream2LLM figures and prints the synthesized statistics
beside the published ones. The argparse wiring (`add_trace_synth_args`, `run_trace_synth`)
imports nothing heavy: the tokenizer and the passage store load when the command runs.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from load_tests.synth.models import WORKLOADS
from load_tests.synth.passage_pool import PassagePool
from load_tests.synth.published import INVALIDATION_THRESHOLD
from load_tests.synth.synthesize import (
    DEFAULT_MAX_PROMPT_TOKENS,
    EMBEDDED_CONTEXT_TOKENS,
    PROMPT_MARGIN_TOKENS,
    SynthParams,
    build_header,
    synthesize,
)
from load_tests.synth.tokens import ApproxTokenCounter, DocTokens, EmbeddedTokenCounter, TokenCounter
from load_tests.synth.trace_stats import measure_trace, statistics_table, trace_statistics
from retriever_svc.replay.trace import write_trace
from servicekit.progress import say


def add_trace_synth_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", required=True, choices=WORKLOADS,
                        help="crawler (append, pages streamed as crawled) or anns (update, refined top-k lists)")
    parser.add_argument("--out", required=True, type=Path, help="trace file to write (JSON lines)")
    parser.add_argument("--queries", type=int, default=SynthParams.queries,
                        help=f"number of queries (default: {SynthParams.queries})")
    parser.add_argument("--token-scale", type=float, default=SynthParams.token_scale,
                        help=f"multiplies the published token counts (default: {SynthParams.token_scale:g}, for the "
                             "embedded model on a CPU; 1 is paper scale, with --max-prompt-tokens 0 for a "
                             "long-context engine)")
    parser.add_argument("--time-scale", type=float, default=SynthParams.time_scale,
                        help="multiplies every time: gaps and retrieval time "
                             f"(default: {SynthParams.time_scale:g}, paper timing)")
    parser.add_argument("--max-prompt-tokens", type=int, default=DEFAULT_MAX_PROMPT_TOKENS,
                        help=f"cap on a query's document tokens (default: {DEFAULT_MAX_PROMPT_TOKENS}, the embedded "
                             f"model's {EMBEDDED_CONTEXT_TOKENS} less {PROMPT_MARGIN_TOKENS} for head, suffix and "
                             "output; 0: no cap; at paper scale for Llama-3.1 use e.g. 120000)")
    parser.add_argument("--seed", type=int, default=SynthParams.seed,
                        help=f"random seed (default: {SynthParams.seed})")
    parser.add_argument("--top-k", type=int, default=SynthParams.top_k,
                        help=f"documents per ANNS list (default: {SynthParams.top_k})")
    parser.add_argument("--passages", type=Path, default=None,
                        help="passage store to take text from (default: <cache>/index/python-3.11-docs/"
                             "passages.sqlite)")
    parser.add_argument("--tokenizer", choices=("embedded", "approx"), default="embedded",
                        help="count tokens with the embedded model's tokenizer (default) or a calibrated "
                             "words-and-punctuation approximation (faster, no model needed)")



def _load_pool(args: argparse.Namespace) -> tuple[PassagePool, Path, str]:
    """The passage pool (with its token counter), the store's path and its corpus name."""
    from retriever_svc.corpus.store import PassageStore

    if args.passages is not None:
        passages_path = Path(args.passages)
    else:
        from retriever_svc.corpus.index import STORE, default_index_dir

        passages_path = default_index_dir() / STORE
    store = PassageStore(passages_path)
    try:
        passages, corpus = store.all(), store.meta().get("corpus", "")
    finally:
        store.close()
    counter: TokenCounter = EmbeddedTokenCounter.load() if args.tokenizer == "embedded" else ApproxTokenCounter()
    return PassagePool(passages, counter), passages_path, corpus


def run_trace_synth(args: argparse.Namespace) -> int:
    """Entry point for `streamrag trace synth`: 0 written, 2 bad arguments or missing inputs."""
    params = SynthParams(args.workload, args.queries, args.token_scale, args.time_scale, args.seed,
                         args.top_k, args.max_prompt_tokens)
    try:
        params.check()
        pool, passages_path, corpus = _load_pool(args)
    except (OSError, ValueError, ImportError) as exc:
        say(f"error: {exc}")
        return 2
    counter = pool.counter
    queries = synthesize(params, pool)
    measures = measure_trace(queries, DocTokens(counter))
    stats = trace_statistics(queries, measures, INVALIDATION_THRESHOLD * params.token_scale)
    invalidation = params.workload == "anns"
    queries = [replace(q, meta={**q.meta, "tokens": m.tokens,
                                **({"tokens_invalidated_upper_bound": m.invalidated} if invalidation else {})})
               for q, m in zip(queries, measures, strict=True)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_trace(args.out, queries, build_header(params, counter, str(passages_path), corpus))
    capped = sum(1 for q in queries if q.meta.get("capped"))
    print(f"{params.workload} trace: {len(queries)} queries, seed {params.seed}, tokens by {counter.name}")
    print(statistics_table(params.workload, stats, params.token_scale, params.time_scale, capped))
    say(f"wrote {len(queries)} queries to {args.out}")
    return 0


def add_trace_stats_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, type=Path, help="trace file (e.g. from `streamrag trace record`)")
    parser.add_argument("--workload", required=True, choices=WORKLOADS, help="the published workload to compare with")
    parser.add_argument("--tokenizer", choices=("embedded", "approx"), default="embedded",
                        help="count tokens with the embedded model's tokenizer (default) or the approximation")


def run_trace_stats(args: argparse.Namespace) -> int:
    """Entry point for `streamrag trace stats`: a trace's statistics beside the published ones."""
    from retriever_svc.replay.trace import TraceFormatError, read_trace

    try:
        queries = read_trace(args.trace).queries
    except TraceFormatError as exc:
        say(f"error: {exc}")
        return 2
    if not queries:
        say(f"error: {args.trace} holds no queries")
        return 2
    counter: TokenCounter = EmbeddedTokenCounter.load() if args.tokenizer == "embedded" else ApproxTokenCounter()
    stats = trace_statistics(queries, measure_trace(queries, DocTokens(counter)))
    print(f"{args.trace}: {len(queries)} queries, tokens by {counter.name}")
    print(statistics_table(args.workload, stats, 1.0, 1.0, label="this trace"))
    return 0
