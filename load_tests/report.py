"""The replay benchmark's summary: percentiles, streaming speedups, `summary.json` and `report.md`.

`summarize_run` turns one replay run's request records into a configuration entry;
`add_speedups` pairs every entry with the non-streaming entry of the same engine, workload,
policy, eviction and QPS of the same run (a non-streaming entry gets 1.0);
`render_report` writes the markdown: per workload, a detail table (every configuration,
p50/p95/p99 TTFT and speedups) and the paper's Table 3 and Table 4 shapes (rows policies,
columns eviction modes). Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from servicekit.stats import percentile

PERCENTILES = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0))
PAIR_KEYS = ("engine", "workload", "policy", "eviction", "qps")     # a baseline per configuration
BASELINE_ONCE_KEYS = ("engine", "workload", "qps")                   # one baseline per engine and load


def percentiles(values: Sequence[float]) -> dict[str, float]:
    out = {name: percentile(values, q) for name, q in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else math.nan
    return out


def summarize_run(meta: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                  trace_completion_s: float) -> dict[str, Any]:
    """One configuration entry from a run's per-request records (see `replay_run.RequestRecord.as_json`)."""
    ok = [r for r in records if r.get("error") is None and r.get("ttft_s") is not None]
    entry: dict[str, Any] = dict(meta)
    entry.update({
        "requests": len(ok),
        "failed": len(records) - len(ok),
        "ttft_s": percentiles([r["ttft_s"] for r in ok]),
        "ttft_from_arrival_s": percentiles([r["ttft_from_arrival_s"] for r in ok]),
        "server_ttft_s": percentiles([r["server_ttft_s"] for r in ok if r.get("server_ttft_s") is not None]),
        "preemptions": {"recompute": sum(r.get("preemptions_recompute", 0) for r in ok),
                        "swap": sum(r.get("preemptions_swap", 0) for r in ok)},
        "tokens_invalidated_total": sum(r.get("tokens_invalidated", 0) for r in ok),
        "tokens_invalidated_per_request": percentiles([float(r.get("tokens_invalidated", 0)) for r in ok]),
        "prompt_tokens_total": sum(r.get("prompt_tokens", 0) for r in ok),
        "tokens_computed_total": sum(r.get("tokens_computed", 0) for r in ok),
        "trace_completion_s": trace_completion_s,
        "max_send_lag_s": max((r.get("send_lag_s", 0.0) for r in records), default=0.0),
    })
    errors = sorted({r["error"] for r in records if r.get("error")})
    if errors:
        entry["errors"] = errors[:5]
    return entry


def _ratio(numerator: float, denominator: float) -> float | None:
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator <= 0:
        return None
    return numerator / denominator


def add_speedups(configs: list[dict[str, Any]], pair_keys: Sequence[str] = PAIR_KEYS) -> list[dict[str, Any]]:
    """Set `speedup_vs_nonstreaming` (non-streaming TTFT / this TTFT, per percentile) in place.

    A configuration is paired with the non-streaming entry that agrees on `pair_keys`.
    """
    baselines = {tuple(c[k] for k in pair_keys): c for c in configs if not c["streaming"]}
    for config in configs:
        base = baselines.get(tuple(config[k] for k in pair_keys))
        if base is None:
            config["speedup_vs_nonstreaming"] = {name: None for name, _ in PERCENTILES}
            continue
        config["speedup_vs_nonstreaming"] = {
            name: (1.0 if config is base else _ratio(base["ttft_s"][name], config["ttft_s"][name]))
            for name, _ in PERCENTILES}
    return configs


# --- markdown ---------------------------------------------------------------------------------

def _s(value: float | None, digits: int = 3) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.2f}x"


def _label(config: Mapping[str, Any]) -> str:
    name = f"{config['policy']}/{config['eviction']} {'streaming' if config['streaming'] else 'non-streaming'}"
    return name if config.get("engine", "native") == "native" else f"{config['engine']} {name}"


def _row(config: Mapping[str, Any]) -> str:
    """A configuration's row in the Table 3/4 shapes: our policies by name, vLLM as vLLM-S / vLLM-NS
    (the paper's names), non-streaming baselines with the configuration they ran in."""
    if config["engine"] != "native":
        return f"{config['engine']}-{'S' if config['streaming'] else 'NS'} ({config['policy']})"
    return config["policy"] if config["streaming"] else f"non-streaming ({config['policy']}/{config['eviction']})"


def _grid(policies: Sequence[str], evictions: Sequence[str], at: Mapping[tuple, Mapping[str, Any]],
          cell: Callable[[Mapping[str, Any]], str]) -> list[list[str]]:
    """The Table 3/4 shape: a row per policy, a column per eviction mode, `cell` of each streaming
    configuration (`—` where none ran)."""
    return [[policy, *("—" if (c := at.get((policy, eviction, True))) is None else cell(c) for eviction in evictions)]
            for policy in policies]


def _preemptions_cell(config: Mapping[str, Any]) -> str:
    rec, swap = config["preemptions"]["recompute"], config["preemptions"]["swap"]
    return f"{rec + swap} ({rec} / {swap})"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _ordered(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def render_report(summary: Mapping[str, Any]) -> str:
    configs: list[Mapping[str, Any]] = summary["configs"]
    meta = summary.get("meta", {})
    lines = ["# Replay benchmark", ""]
    if meta:
        lines += [f"- {key}: `{value}`" for key, value in meta.items()] + [""]
    lines += ["TTFT is the paper's: first token minus the arrival of the query's last context chunk. "
              "Time from arrival is first token minus the query's (Poisson) arrival. Speedups are "
              "non-streaming TTFT / streaming TTFT of the same engine, workload and QPS in this run "
              "(and the same policy and eviction when the baseline ran in every configuration). "
              "Completion is the time from the run's start to its last request's end "
              "(throughput parity: streaming should match non-streaming).", ""]
    for workload in _ordered(c["workload"] for c in configs):
        group = [c for c in configs if c["workload"] == workload]
        lines += [f"## Workload: {workload}", "", "### All configurations", ""]
        lines += _table(
            ["config", "QPS", "requests", "TTFT p50 (s)", "p95", "p99", "from arrival p50 (s)", "p99",
             "speedup p50", "p95", "p99", "preempt recompute/swap", "tokens invalidated",
             "prompt tokens computed (engine)", "completion (s)"],
            ([_label(c), f"{c['qps']:g}", str(c["requests"]) + (f" ({c['failed']} failed)" if c.get("failed") else ""),
              _s(c["ttft_s"]["p50"]), _s(c["ttft_s"]["p95"]), _s(c["ttft_s"]["p99"]),
              _s(c["ttft_from_arrival_s"]["p50"]), _s(c["ttft_from_arrival_s"]["p99"]),
              _x(c["speedup_vs_nonstreaming"]["p50"]), _x(c["speedup_vs_nonstreaming"]["p95"]),
              _x(c["speedup_vs_nonstreaming"]["p99"]),
              f"{c['preemptions']['recompute']}/{c['preemptions']['swap']}", str(c["tokens_invalidated_total"]),
              str(c.get("engine_counters", {}).get("prompt_tokens_computed", "—")),
              _s(c["trace_completion_s"], 2)] for c in group))
        lines.append("")
        policies = _ordered(_row(c) for c in group if c["streaming"])
        evictions = _ordered(c["eviction"] for c in group)
        for qps in _ordered(c["qps"] for c in group):
            at = {(_row(c), c["eviction"], c["streaming"]): c for c in group if c["qps"] == qps}
            lines += [f"### Table 3 shape: streaming speedup vs non-streaming, QPS {qps:g} "
                      "(cell: speedup P50 / P99 (streaming TTFT P50 / P99 in s))", ""]
            rows = _grid(policies, evictions, at, lambda c: (
                f"{_x(c['speedup_vs_nonstreaming']['p50'])} / {_x(c['speedup_vs_nonstreaming']['p99'])} "
                f"({_s(c['ttft_s']['p50'])} / {_s(c['ttft_s']['p99'])})"))
            baseline = [c for c in group if c["qps"] == qps and not c["streaming"]]
            rows += [[_row(c)] +
                     [f"1.00x / 1.00x ({_s(c['ttft_s']['p50'])} / {_s(c['ttft_s']['p99'])})"
                      if e == c["eviction"] else "" for e in evictions] for c in baseline]
            lines += [*_table(["policy", *evictions], rows), ""]
            lines += [f"### Table 4 shape: preemptions (streaming), QPS {qps:g} "
                      "(cell: total (recompute / swap))", ""]
            rows = _grid(policies, evictions, at, _preemptions_cell)
            lines += [*_table(["policy", *evictions], rows), ""]
    lines += _vllm_comparison(configs)
    if summary.get("plots"):
        lines += ["## Figures", ""] + [f"![{name}]({name})" for name in summary["plots"]] + [""]
    return "\n".join(lines).rstrip() + "\n"


def _vllm_comparison(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Our streaming configurations (the native engine, and our policies inside vLLM) against vLLM-S
    (vLLM's own scheduler and streaming input: `--engine vllm` with policy `default`), same workload and
    QPS: vLLM-S TTFT / ours, per percentile (above 1: ours is faster)."""
    vllm_s = {(c["workload"], c["qps"]): c for c in configs
              if c["engine"] == "vllm" and c["streaming"] and c["policy"] == "default"}
    ours = [c for c in configs if c["streaming"] and (c["workload"], c["qps"]) in vllm_s
            and not (c["engine"] == "vllm" and c["policy"] == "default")]
    if not ours:
        return []
    lines = ["## Ours against vLLM-S (vLLM's streaming input)", "",
             "Cell: vLLM-S TTFT / our TTFT (above 1: ours is faster), same workload and QPS in this run.", ""]
    rows = []
    for c in ours:
        peer = vllm_s[(c["workload"], c["qps"])]
        rows.append([c["workload"], f"{c['qps']:g}", _label(c),
                     *(_x(_ratio(peer["ttft_s"][p], c["ttft_s"][p])) for p, _ in PERCENTILES),
                     f"{_s(peer['ttft_s']['p50'])} / {_s(peer['ttft_s']['p95'])}"])
    return [*lines, *_table(["workload", "QPS", "ours", "p50", "p95", "p99", "vLLM-S p50 / p95 (s)"], rows), ""]
