"""From `bench sessions` rows to what it reports: each point's median and spread over seeds, the
same-seed ratios the issue set as targets, ingestion throughput, and the markdown tables."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from load_tests.runner import spread

METRICS = ("session_query_ttft_ms", "session_query_server_ttft_ms", "generate_ttft_ms", "prefix_cache_ttft_ms",
           "flash_hit_ms", "flash_hit_server_ms", "vllm_prefix_cache_ttft_ms")


def combine(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per `--points` entry: each metric's median over seeds, with `_min` and `_max`."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["point"], []).append(row)
    points = []
    for _, group in sorted(grouped.items()):
        out: dict[str, Any] = {"context_tokens": round(statistics.median(r["context_tokens"] for r in group)),
                               "seeds": len(group)}
        for key in METRICS:
            values = [r[key] for r in group if r.get(key) is not None]
            if values:
                stat = spread(values)
                out[key], out[f"{key}_min"], out[f"{key}_max"] = stat["median"], stat["min"], stat["max"]
        out["session_shared_tokens"] = min(r["session_shared_tokens"] for r in group)
        out["session_context_tokens"] = max(r["session_context_tokens"] for r in group)
        points.append(out)
    return points


def ratios(points: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, each as a median over seeds of the same-seed ratio, with the spread."""
    first, last = min(r["point"] for r in rows), max(r["point"] for r in rows)
    by_seed: dict[int, dict[int, dict[str, Any]]] = {}
    for row in rows:
        by_seed.setdefault(row["seed"], {})[row["point"]] = row
    growth, vs_generate, vs_prefix, vs_vllm, flash_server = [], [], [], [], []
    for seed_rows in by_seed.values():
        small, large = seed_rows[first], seed_rows[last]
        growth.append(large["session_query_ttft_ms"] / small["session_query_ttft_ms"])
        vs_generate.append(large["generate_ttft_ms"] / large["session_query_ttft_ms"])
        vs_prefix.append(large["prefix_cache_ttft_ms"] / large["session_query_ttft_ms"])
        if large.get("vllm_prefix_cache_ttft_ms") is not None:
            vs_vllm.append(large["vllm_prefix_cache_ttft_ms"] / large["session_query_ttft_ms"])
        flash_server.extend(r["flash_hit_server_ms"] for r in seed_rows.values())
    out = {
        "session_query_growth": spread(growth),             # largest / smallest context, target <= 1.2
        "speedup_vs_generate": spread(vs_generate),         # at the largest context, target >= 5
        "speedup_vs_prefix_cache": spread(vs_prefix),       # at the largest context, target >= 2.4
        "flash_hit_server_ms_max": max(flash_server),       # every point and seed, target < 5
    }
    if vs_vllm:
        out["speedup_vs_vllm_prefix_cache"] = spread(vs_vllm)
    out["targets_met"] = {
        "session_query_growth_le_1.2": out["session_query_growth"]["median"] <= 1.2,
        "speedup_vs_generate_ge_5": out["speedup_vs_generate"]["median"] >= 5,
        "speedup_vs_prefix_cache_ge_2.4": out["speedup_vs_prefix_cache"]["median"] >= 2.4,
        "flash_hit_server_lt_5ms": out["flash_hit_server_ms_max"] < 5,
    }
    return out


def format_ratios(r: dict[str, Any]) -> str:
    return (f"Same-seed ratios (median, min-max): session query largest/smallest "
            f"{r['session_query_growth']['median']:.2f}x ({r['session_query_growth']['min']:.2f}-"
            f"{r['session_query_growth']['max']:.2f}); at the largest context vs Generate "
            f"{r['speedup_vs_generate']['median']:.1f}x, vs the prefix cache "
            f"{r['speedup_vs_prefix_cache']['median']:.2f}x "
            f"({r['speedup_vs_prefix_cache']['min']:.2f}-{r['speedup_vs_prefix_cache']['max']:.2f}); "
            f"Flash hit at the service at most {r['flash_hit_server_ms_max']:.3f} ms")


def _cell(point: dict[str, Any], key: str, fmt: str = "{:.1f}") -> str:
    if point.get(key) is None:
        return "-"
    if point["seeds"] == 1:
        return fmt.format(point[key])
    return f"{fmt.format(point[key])} ({fmt.format(point[key + '_min'])}-{fmt.format(point[key + '_max'])})"


def format_table(points: Sequence[dict[str, Any]]) -> str:
    vllm = any(p.get("vllm_prefix_cache_ttft_ms") is not None for p in points)
    head = ("| context tokens | session query TTFT ms | Generate (cold) TTFT ms | prefix cache (warm) TTFT ms "
            + ("| vLLM prefix cache TTFT ms " if vllm else "")
            + "| Flash hit ms (client) | Flash hit ms (server) | vs Generate | vs prefix cache |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for p in points:
        lines.append(
            f"| {p['context_tokens']:,} | {_cell(p, 'session_query_ttft_ms')} "
            f"| {_cell(p, 'generate_ttft_ms', '{:.0f}')} | {_cell(p, 'prefix_cache_ttft_ms')} "
            + (f"| {_cell(p, 'vllm_prefix_cache_ttft_ms')} " if vllm else "")
            + f"| {_cell(p, 'flash_hit_ms', '{:.2f}')} | {_cell(p, 'flash_hit_server_ms', '{:.3f}')} "
            f"| {p['generate_ttft_ms'] / p['session_query_ttft_ms']:.1f}x "
            f"| {p['prefix_cache_ttft_ms'] / p['session_query_ttft_ms']:.1f}x |")
    lines.append("\nCells: median over seeds (min-max). The ratio columns divide the medians; the targets use "
                 "same-seed ratios (JSON `ratios`).")
    return "\n".join(lines)


def format_ingestion(ingestion: dict[str, Any]) -> str:
    lines = ["| ingestion | tokens/s | queries meanwhile | their TTFT p50 ms |", "|---|---|---|---|"]
    for name in ("without_queries", "with_queries"):
        entry = ingestion.get(name)
        if entry:
            ttft = entry.get("query_ttft_ms")
            lines.append(f"| {name.replace('_', ' ')} | {entry['tokens_per_s']['median']:.0f} "
                         f"({entry['tokens_per_s']['min']:.0f}-{entry['tokens_per_s']['max']:.0f}) "
                         f"| {entry['queries']} | {'-' if ttft is None else format(ttft['median'], '.0f')} |")
    return "\n".join(lines)


def summarize_ingestion(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Tokens/s per seed (all its ingested tokens over all its ingest time), with and without
    queries running; median and spread over seeds."""
    out = {}
    for name, flag in (("without_queries", False), ("with_queries", True)):
        per_seed: dict[int, list[dict[str, Any]]] = {}
        for run in runs:
            if run["with_queries"] is flag:
                per_seed.setdefault(run["seed"], []).append(run)
        if not per_seed:
            continue
        rates = [sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs) for rs in per_seed.values()]
        ttfts = [r["query_ttft_ms"] for rs in per_seed.values() for r in rs if r["query_ttft_ms"] is not None]
        queries = sum(r["queries"] for rs in per_seed.values() for r in rs)
        out[name] = {"tokens_per_s": spread(rates), "queries": queries,
                     "query_ttft_ms": spread(ttfts) if ttfts else None}
    return out
