"""Combine the replay benchmark over several arrival seeds: median and spread of every ratio.

Single runs on these machines varied up to 2x, so each configuration is replayed with several
Poisson-arrival seeds (`streamrag bench replay --seed N --out DIR/seed-N`) and judged by the
median of its per-seed streaming speedups, with the min-max spread beside it:

    python -m load_tests.seeds OUT/anns/seed-0 OUT/anns/seed-1 OUT/anns/seed-2 [--label after]

prints a markdown table per workload and writes `seeds.json` beside the first directory's parent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from load_tests.cli_types import write_json
from load_tests.report import PERCENTILES

KEY = ("engine", "workload", "policy", "eviction", "qps", "streaming")


def load(directory: Path) -> list[dict[str, Any]]:
    summary = json.loads((directory / "summary.json").read_text())
    return summary["configs"]


def spread(values: Sequence[float]) -> dict[str, float]:
    """The median of per-seed values with their min and max: how every benchmark reports seeds."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load_tests.seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="bench replay output directories, one per seed")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=None, help="seeds.json (default: beside the runs)")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.runs if not (d / "summary.json").is_file()]
    if missing:
        print(f"error: no summary.json in {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = combine([load(d) for d in args.runs])
    out = args.out or args.runs[0].parent / "seeds.json"
    write_json(out, {"runs": [str(d) for d in args.runs], "rows": rows})
    print(render(rows, args.label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
