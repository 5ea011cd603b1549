"""Which requests streaming made slower: the per-request side of "streaming never loses".

A replay run (`streamrag bench replay --out DIR`) sends every query twice, streamed and not, on
the same arrivals; its `requests.jsonl` has both rows. Percentile ratios can hide a request that
streaming made slower, so this pairs the rows by query and counts, per configuration and run, the
requests whose streamed TTFT is above their non-streamed TTFT (by more than `--margin` seconds),
and names the worst:

    streamrag bench per-request OUT/anns/seed-0 OUT/anns/seed-1 OUT/anns/seed-2 [--margin 0.05] [--worst 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG = ("engine", "workload", "policy", "eviction", "qps")


@dataclass(frozen=True)
class Pair:
    query_id: str
    streamed_s: float
    baseline_s: float
    chunks: int
    prompt_tokens: int

    @property
    def loss_s(self) -> float:
        """How much later streaming's first token came (negative: earlier)."""
        return self.streamed_s - self.baseline_s


def load_rows(directory: Path) -> list[dict[str, Any]]:
    with (directory / "requests.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def pairs(rows: Sequence[dict[str, Any]]) -> dict[tuple, list[Pair]]:
    """Streamed and non-streamed rows of the same query, per configuration; failed requests are left out."""
    by_key: dict[tuple, dict[str, dict[bool, dict[str, Any]]]] = {}
    for row in rows:
        if row.get("error") or row.get("ttft_s") is None:
            continue
        config = tuple(row.get(k) for k in CONFIG)
        by_key.setdefault(config, {}).setdefault(row["query_id"], {})[bool(row["streaming"])] = row
    out: dict[tuple, list[Pair]] = {}
    for config, queries in by_key.items():
        matched = [Pair(qid, both[True]["ttft_s"], both[False]["ttft_s"], both[True].get("chunks", 0),
                        both[True].get("prompt_tokens", 0))
                   for qid, both in sorted(queries.items()) if True in both and False in both]
        if matched:
            out[config] = matched
    return out


def render(runs: Sequence[tuple[str, dict[tuple, list[Pair]]]], margin_s: float, worst: int) -> str:
    lines = [f"| run | workload | policy | eviction | QPS | requests | slower streamed | by > {margin_s:g} s "
             f"| worst (query: streamed / non-streamed s, chunks, prompt tokens) |", "|" + "---|" * 9]
    for name, configs in runs:
        for config, matched in sorted(configs.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
            _, workload, policy, eviction, qps = config
            slower = sorted((p for p in matched if p.loss_s > 0), key=lambda p: -p.loss_s)
            beyond = [p for p in slower if p.loss_s > margin_s]
            named = "; ".join(f"{p.query_id}: {p.streamed_s:.2f} / {p.baseline_s:.2f}, {p.chunks}, {p.prompt_tokens}"
                              for p in slower[:worst]) or "-"
            lines.append(f"| {name} | {workload} | {policy} | {eviction} | {qps} | {len(matched)} | {len(slower)} | "
                         f"{len(beyond)} | {named} |")
    return "\n".join(lines)


def add_bench_per_request_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="+", help="bench replay output directories")
    parser.add_argument("--margin", type=float, default=0.05, help="seconds of loss counted apart (default 0.05)")
    parser.add_argument("--worst", type=int, default=3, help="slowest-streamed requests named per row (default 3)")


def run_bench_per_request(args: argparse.Namespace) -> int:
    missing = [str(d) for d in args.runs if not (d / "requests.jsonl").is_file()]
    if missing:
        print(f"error: no requests.jsonl in {', '.join(missing)}", file=sys.stderr)
        return 2
    print(render([(str(d), pairs(load_rows(d))) for d in args.runs], args.margin, args.worst))
    return 0

