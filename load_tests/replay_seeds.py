"""Several arrival seeds of `streamrag bench replay --seeds`: the median and spread of every ratio.

Single runs on these machines varied up to 2x, so each configuration is replayed with several
Poisson-arrival seeds and judged by the median of its per-seed values with the min-max spread
beside it. Two views of the same runs, both printed by `bench replay` when it ran several seeds:

- `combine` / `render`: per configuration, TTFT and the streaming speedup at p50/p95/p99, tokens
  computed and invalidated, completion time and preemptions (`DIR/seeds.json`, `DIR/seeds.md`);
- `peer_ratios`: per seed, from the same run, every pair of configurations below that the run holds
  (ours against vLLM): TTFT ratio = baseline TTFT / subject TTFT (above 1: the subject is faster),
  then the median and min-max over seeds. vLLM-NS is `Generate` on the `default` service, or on the
  `fcfs` one where the run had only that; a run with several QPS is split by QPS.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from load_tests.report import PERCENTILES
from load_tests.runner import spread

KEY = ("engine", "workload", "policy", "eviction", "qps", "streaming")


def combine(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per configuration: for each percentile the per-seed TTFTs and speedups, their
    median and min/max; also tokens computed and invalidated summed per seed (median)."""
    grouped: dict[tuple, list[dict[str, Any]]] = {}
    for configs in runs:
        for config in configs:
            grouped.setdefault(tuple(config.get(k) for k in KEY), []).append(config)
    rows = []
    for key, configs in sorted(grouped.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        row: dict[str, Any] = dict(zip(KEY, key, strict=True))
        row["seeds"] = len(configs)
        for name, _ in PERCENTILES:
            ttft = [c["ttft_s"][name] for c in configs]
            speedups = [s for c in configs if (s := (c.get("speedup_vs_nonstreaming") or {}).get(name)) is not None]
            row[f"ttft_{name}"] = spread(ttft)
            row[f"speedup_{name}"] = spread(speedups) if speedups else None
        row["tokens_computed"] = statistics.median(c.get("tokens_computed_total", 0) for c in configs)
        row["tokens_invalidated"] = statistics.median(c.get("tokens_invalidated_total", 0) for c in configs)
        row["trace_completion_s"] = statistics.median(c.get("trace_completion_s", 0.0) for c in configs)
        for kind in ("recompute", "swap"):      # evictions of each kind (median over seeds)
            row[f"preemptions_{kind}"] = statistics.median((c.get("preemptions") or {}).get(kind, 0) for c in configs)
        rows.append(row)
    return rows


def _cell(stat: dict[str, float] | None, fmt: str = "{:.2f}") -> str:
    if stat is None:
        return "-"
    return f"{fmt.format(stat['median'])} ({fmt.format(stat['min'])}-{fmt.format(stat['max'])})"


def render(rows: Sequence[dict[str, Any]], label: str = "") -> str:
    head = ("| workload | policy | eviction | QPS | mode | seeds | TTFT p50 s | p95 s | p99 s "
            "| speedup p50 | p95 | p99 | tokens computed | invalidated | completion s | preemptions recompute / swap |")
    lines = [f"**{label}**" if label else "", head, "|" + "---|" * 16]
    for r in rows:
        mode = "streaming" if r["streaming"] else "non-streaming"
        lines.append(f"| {r['workload']} | {r['policy']} | {r['eviction']} | {r['qps']} | {mode} | {r['seeds']} | "
                     f"{_cell(r['ttft_p50'])} | {_cell(r['ttft_p95'])} | {_cell(r['ttft_p99'])} | "
                     f"{_cell(r['speedup_p50'])} | {_cell(r['speedup_p95'])} | {_cell(r['speedup_p99'])} | "
                     f"{r['tokens_computed']:.0f} | {r['tokens_invalidated']:.0f} | {r['trace_completion_s']:.1f} | "
                     f"{r['preemptions_recompute']:g} / {r['preemptions_swap']:g} |")
    lines.append("\nCells: median over seeds (min-max). Speedup: non-streaming TTFT / streaming TTFT, same seed.")
    return "\n".join(line for line in lines if line is not None)


PCTS = ("p50", "p95", "p99")
NAMES = {("vllm", "default", True): "vLLM-S", ("vllm", "fcfs", True): "vLLM+fcfs",
         ("native", "fcfs", True): "native fcfs-S", ("native", "default", True): "native default-S"}
# (subject, baseline): the question each pair answers
PAIRS = [("vLLM+fcfs", "vLLM-S"), ("vLLM+fcfs", "vLLM-NS"), ("vLLM+fcfs", "native fcfs-S"),
         ("native fcfs-S", "vLLM-S"), ("native fcfs-S", "vLLM-NS"), ("native fcfs-S", "native-NS")]


def named_configs(configs: Sequence[dict[str, Any]]) -> dict[float | None, dict[str, dict[str, Any]]]:
    """Each QPS's configurations of one run by name."""
    by_qps: dict[float | None, dict[str, dict[str, Any]]] = {}
    for c in configs:
        out = by_qps.setdefault(c.get("qps"), {})
        key = (c.get("engine", "native"), c["policy"], c["streaming"])
        if key in NAMES:
            out[NAMES[key]] = c
        elif not c["streaming"]:
            name = "vLLM-NS" if key[0] == "vllm" else "native-NS"
            if name not in out or key[1] == "default":
                out[name] = c
    return by_qps


def peer_ratios(runs: Sequence[Sequence[dict[str, Any]]]) -> list[str]:
    """The lines `bench replay` prints for its seeds' runs (each a list of configs): every pair's
    ratio per seed, then the median (min-max) over seeds."""
    lines: list[str] = []
    per: dict[str, list[float]] = {}
    by_run = [(i, qps, cs) for i, configs in enumerate(runs) for qps, cs in named_configs(configs).items()]
    several = len({qps for _, qps, _ in by_run}) > 1
    for i, qps, cs in by_run:
        at = f" qps={qps:g}" if several else ""
        lines.append(f"run {i}{at}: " + "; ".join(
            f"{name} " + "/".join(f"{c['ttft_s'][p]:.3f}" for p in PCTS)
            + f" ({c['requests']} ok, {c.get('failed', 0)} failed, completion {c['trace_completion_s']:.0f} s)"
            for name, c in cs.items()))
        cells = []
        for subject, baseline in PAIRS:
            if subject in cs and baseline in cs:
                for p in PCTS:
                    r = cs[baseline]["ttft_s"][p] / cs[subject]["ttft_s"][p]
                    per.setdefault(f"{subject} vs {baseline}{at} {p}", []).append(r)
                    cells.append(f"{subject} vs {baseline} {p} {r:.2f}x")
        lines.append("    " + ", ".join(cells))
    lines.append(f"median (min-max) over {len(runs)} seed(s):")
    lines += [f"    {key}: {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})" for key, r in per.items()]
    return lines
