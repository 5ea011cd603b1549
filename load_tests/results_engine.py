"""The results page's engine and retrieval sections: speculative decoding, retrieval quality and early
results, Milvus, documents, blend, bounded steps, prefill speed and the GPU. Templates as in results_sections.py."""

from __future__ import annotations

from load_tests.results_summary import (
    Node,
    block,
    image,
    table,
    targets,
)


def decode(s: dict[str, Node]) -> list[str]:
    d = s["decode"]
    grid = d["grid"]["rows"]
    rows = []
    for workload in ("rag", "free"):
        for conc in (1, 4, 16):
            off, auto = grid[f"{workload}-{conc}-off"], grid[f"{workload}-{conc}-auto"]
            fixed = [r for r in grid if r["workload"].value == workload and r["concurrency"].value == conc
                     and r["mode"].value not in ("off", "auto")]
            best = max(fixed, key=lambda r: r["vs_off"]["median"].number())
            rows.append(f"{workload} | {conc} | {off['tokens_per_s']} | {auto['tokens_per_s']} | "
                        f"{auto['vs_off']:x} | {auto['acceptance']} | k = {best['mode']}: {best['vs_off']:x}")
    ask = d["ask"]
    return [
        "## Speculative decoding from the context", "",
        "The engine drafts tokens by matching the answer's last tokens against the prompt (RAG answers "
        "quote their context) and verifies a draft in one step; `auto` (the default) picks the depth from "
        "the measured acceptance and the cost of a verification at the current batch size.", "",
        *block(d["grid"]),
        *table(["workload", "requests", "off tokens/s", "auto tokens/s", "auto / off (per seed)",
                "acceptance", "best fixed depth / off"], rows, right=1),
        *image("decode", "decode speed against off, by depth and concurrency"),
        f"Time to the whole answer through the stack (`streamrag ask`, {ask['max_tokens']} tokens at most): "
        f"auto answered in {ask['auto']['total_s']:.2f} s against {ask['off']['total_s']:.2f} s with speculation off. "
        f"The answers differ ({ask['auto']['chars']} and {ask['off']['chars']} characters: bf16 near-ties "
        f"move a greedy argmax); per answer character auto was {ask['per_char_gain']:x} faster. "
        f"A drafted token costs {d['verify_cost_per_token']} of a step alone, more in a batch (verifying "
        "sequences are attended one by one).", "",
        *block(ask, cells="median (min-max) over the asks"),
        *targets(d),
    ]


def retrieval(s: dict[str, Node]) -> list[str]:
    r = s["retrieval"]
    q, anns, cal = r["quality"], r["anns"], r["calibration"]
    q_rows = [f"{x['retriever']} | {x['asks']} | {x['hit1']}% | {x['hit3']}% | {x['hit5']}% | "
              f"{x['first_relevant_p50']} | {x['last_chunk_p50']} | {x['cut']}" for x in q["rows"]]
    a_rows = [f"{x['stage']} | {x['L']} | {x['p50_ms']:.2f} | {x['p95_ms']:.2f} | {x['recall']:.3f} | "
              f"{x['overlap']:.3f} | {x['emitting']:.2f}" for x in anns["rows"]]
    return [
        "## Retrieval quality and ANNS early results", "",
        f"Does the prompt hold the page that answers the question? {q['rows']['anns']['asks']} questions written "
        f"with their answering pages, one Ask at a time through the stack (top {q['top_k']} sources, "
        f"{q['deadline_s']} s retrieval deadline); hit@k: an answering page among the first k sources of the "
        "final prompt.", "",
        *block(q, cells="one value per retriever"),
        *table(["retriever", "asks", "hit@1", "hit@3", "hit@5", "first relevant chunk p50 s",
                "last chunk p50 s", "cut by the deadline"], q_rows),
        f"The crawler's relevance threshold ({cal['threshold']}) and the merge margin ({cal['margin']}) were "
        f"calibrated on crawls of the same questions that keep every page (`{cal['command']}`): every "
        f"threshold up to {cal['safe_up_to']} keeps hit@5 at {cal['hit5']}%, {cal['first_loss']} loses "
        f"{cal['lost']} questions; with the margin "
        f"{cal['moved_pct']}% of the crawler's pages move ahead of earlier ones ({cal['moved_without_pct']}% "
        "without), each move an `update` that invalidates the pages behind it. The ANNS retriever streams early "
        "results: a DiskANN search over the Python docs emits its list "
        "at growing search-list sizes L, each stage cumulative from the search's start (a single full search "
        f"at the last L takes p50 {anns['full_search_p50_ms']} ms).", "",
        *block(anns, cells="percentiles over the queries"),
        *table(["stage", "L", "p50 ms", "p95 ms", "recall@10", "overlap with the final list", "share emitting"],
               a_rows),
        *image("retrieval", "ANNS early results: recall against time"),
        *targets(r),
    ]


def milvus(s: dict[str, Node]) -> list[str]:
    m = s["retrieval_backends"]
    rows = [f"{b['index']} | {b['recall_at_10']:.3f} | {b['hit_at_5']['median'].number():.1%} | "
            f"{b['first_emit_pct']:.0f}% | "
            + "; ".join(f"{c['p50_ms']['median'].number():.1f} / {c['p99_ms']['median'].number():.1f} / "
                        f"{c['qps']['median'].number():.0f}" for c in b["concurrency"]) for b in m["backends"]]
    return [
        "### The ANNS retriever on Milvus", "",
        "The same `Retrieve` contract, collections and early results on Milvus (`--backend milvus`): the embedded "
        "server from PyPI, whose build has no DiskANN, so it serves HNSW (docs/documents.md says why and how a "
        f"Milvus cluster takes DISKANN); the default corpus ({m['passages']} passages), {m['queries_per_run']} "
        f"queries a run, k {m['k']}, list sizes {', '.join(str(x) for x in m['l_schedule'].value)}.", "",
        *block(m),
        *table(["backend", "recall@10", "hit@5", "first emit / full search",
                "p50 ms / p99 ms / QPS at 1; 2; 4 clients"], rows),
        *targets(m),
    ]


def documents(s: dict[str, Node]) -> list[str]:
    d = s["documents"]
    run = d["ingest"]
    value = {str(r["id"]): format(r["value"], f".{int(r['digits'].number())}f") for r in run["rows"]}
    rows = [f"{what} | {' / '.join(value[k] for k in keys)}" + (f" = {value[ratio]}x" if ratio else "")
            for what, keys, ratio in (
                ("embedding, passages/s: OpenVINO bf16 (the default) / torch bf16 autocast", ("embed", "embed_before"),
                 "embed_ratio"),
                ("insert to searchable, one file, s: p50 / p99", ("insert_p50", "insert_p99"), None),
                ("recall@10 after churn: before / after a merge", ("recall_churn", "recall_merged"), None),
                ("search p99 ms: while ingesting / idle", ("search_ingesting", "search_idle"), "search_ratio"))]
    return [
        "## Your own documents, live", "",
        "A real ANNS retriever process takes a collection of the Python docs' HTML pages: a base part added "
        "and merged into a DiskANN disk index, then more pages added one at a time while it serves 2 searches/s "
        "(each add answered once the file is searchable), then about half of the base's passages removed; "
        "recall@10 is measured against exact search over the live passages before and after a merge "
        "(`docs/documents.md`).", "",
        *block(run),
        *table(["measure", "median (min-max)"], rows, right=2),
        *targets(d),
    ]


def blend(s: dict[str, Node]) -> list[str]:
    b = s["blend"]
    sweep = list(b["sweep"])
    # Columns the same in every row are one sentence: the store's hits per passage (the same requests at every
    # share) and the tokens recomputed (the share itself, when the bench recomputed what it was asked to).
    hits = {format(r["hit_rate"], ".2f") for r in sweep}
    as_asked = all(abs(r["recompute_fraction"]["median"].number() - r["fraction"].number()) < 0.005 for r in sweep)
    extra = {"chunk-cache hits per passage": len(hits) > 1, "tokens recomputed / reused": not as_asked}
    rows = [" | ".join([f"{r['fraction']:g}", format(r["ttft_speedup"], "x"),
                        f"{r['answer_agreement']['median'].number():.0%}"]
                       + ([format(r["hit_rate"], ".2f")] if extra["chunk-cache hits per passage"] else [])
                       + ([f"{r['recompute_fraction']['median'].number():.2f}"] if not as_asked else []))
            for r in sweep]
    same = ([f"chunk-cache hits per passage {hits.pop()}"] if len(hits) == 1 else []) + (
        ["tokens recomputed / reused equal to the recomputed share (to 2 decimals)"] if as_asked else [])
    a = b["anns"]
    return [
        "## Reusing retrieved passages' KV (blend)", "",
        "`kv_reuse: blend` (per request; `streamrag ask --kv-reuse blend`) reuses a passage's KV that an earlier "
        "request or refinement prefilled, at its new position: the keys re-rotated, the `--blend-recompute` "
        "share of its tokens whose KV deviates most recomputed (CacheBlend's way). It is approximate and says so in "
        "the answer's stats; `exact` stays the default. Across requests: questions from the quality set drawn "
        f"with a Zipf skew (s = {b['zipf']}), each prompt its answering page's passages plus popular ones; TTFT of "
        "blend against exact on the same requests, and the share of answers whose first 32 greedy tokens equal "
        "exact's.", "",
        *block(b),
        *table(["recomputed share", "TTFT speedup over exact", "answers equal to exact (32 tokens)",
                *(name for name, shown in extra.items() if shown)], rows),
        *image("blend", "answer agreement against TTFT speedup by recomputed share"),
        (f"In every row: {'; '.join(same)}. " if same else "")
        + "On the ANNS replay (update mode), streaming against not streaming at p95: "
        f"exact {a['p95_speedup_exact']:x}, blend {a['p95_speedup_blend']:x}; streaming blend took the KV of "
        f"{a['blend_reused_share']['median'].number():.0%} of the tokens it prefilled from the chunk store.", "",
        *targets(b),
    ]


def steps(s: dict[str, Node]) -> list[str]:
    st = s["steps"]
    rows = [f"{r['dtype']} | "
            + (f"fixed {r['token_budget'].number():,.0f}" if r["target_ms"].value is None
               else f"{r['target_ms'].number():g} ms target")
            + " | "
            f"{r['step_ms_p50']:.0f} | {r['step_ms_p99']:.0f} | {r['cancel_ms']:.0f} | {r['new_ttft_ms']:.0f} | "
            f"{r['tokens_per_s']:.0f}" for r in st["rows"]]
    return [
        "### Steps bounded in time", "",
        "A cancel or a new arrival waits for the engine step in flight. With `--step-time-target-ms 250` (the "
        "service default) each step's token budget is what the cost profile, refit online from the measured "
        "steps, says fits 250 ms; `--token-budget` stays the cap. Two 4,000-token prompts still receiving "
        "context prefill; 0.3-1.5 s in, one is cancelled and a 64-token prompt arrives.", "",
        *block(st),
        *table(["dtype", "budget", "step p50 ms", "step p99 ms", "cancel to blocks freed ms", "new arrival TTFT ms",
                "prefill tokens/s"], rows, right=5),
        "Every cancel took effect after the one step in flight. The price is throughput: shorter steps pay a "
        "forward pass's fixed cost (about 100 ms here) more often, so a long prefill alone runs 30-40% slower; "
        "`--step-time-target-ms off` restores the fixed budget for throughput runs.", "",
        *targets(st),
    ]


def engine(s: dict[str, Node]) -> list[str]:
    e = s["engine"]
    pre = e["prefill"]
    rows = [f"{r['tokens']} | {r['ours']} | {r['hf']} | {r['hf_ratio']:x} | {r['chunked_ratio']:x} | "
            f"{r['vllm_ratio']:x}" for r in pre["rows"]]
    return [
        "## Engine: prefill speed and scheduler overhead", "",
        "Prefill tokens/s of our engine on random prompts against the transformers forward of the same "
        "weights and against vLLM, one prompt at a time (concurrent prefill is under \"Ours against vLLM\"); "
        "the same command times the scheduler alone, without a model, over "
        f"{e['scheduler']['steps']} steps of every policy (the targets below).", "",
        *block(pre, cells=str(pre["cells"])),
        *table(["prompt tokens", "ours tokens/s", "transformers tokens/s", "ours / transformers",
                f"the same in {pre['chunk_tokens']}-token chunks", "ours / vLLM"], rows),
        *image("engine", "prefill tokens/s against prompt length"),
        *targets(e),
    ]


def gpu(s: dict[str, Node]) -> list[str]:
    g = s["gpu"]
    lines = [
        "## The engine on a GPU", "",
        "Decode through the Engine against the memory roofline (the weights plus the KV a step reads, at the "
        "copy rate measured in the same run), a step at a context length never seen against a repeated one, "
        "prefill MFU one shot and in 512-token chunks, streaming TTFT against not, launches and host syncs per "
        "decode step; random weights, since none travel to the GPU machine.", "",
        *block(g, cells="one run"),
    ]
    if g.get("decode") is not None:
        lines += [f"Card: **{g['gpu']}**; bf16 matmul {g['matmul_tflops']} TFLOP/s and copy {g['hbm_tb_s']} TB/s "
                  f"measured in the run; fp32 exactness: {g['exact_fp32']}; per decode step "
                  f"{g['launches_per_step']} launches and {g['host_syncs_per_step']} host syncs.", ""]
        lines += table(["concurrency", "fresh step ms", "repeated step ms", "share of the roofline"],
                       [f"{r['concurrency']} | {r['fresh_step_ms']} | {r['repeated_step_ms']} | "
                        f"{r['roofline_fraction'].number():.0%}" for r in g["decode"]])
        lines += table(["prefill tokens", "chunk", "MFU"],
                       [f"{r['tokens']} | {r['chunk'].value or 'one shot'} | {r['mfu'].number():.0%}"
                        for r in g["prefill"]])
        lines += table(["document gap ms", "streaming TTFT speedup"],
                       [f"{r['gap_ms']} | {r['speedup']:x}" for r in g["streaming"]])
    base = g["baseline"]
    lines += [f"Baseline without these kernels ({base['card']}, {base['software']}; {base['note']}): "
              + "; ".join(f"{r['what']}: {r['value']}" for r in base["rows"]) + ".", ""]
    return lines

