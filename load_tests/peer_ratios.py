"""Ratios between the configurations of `bench replay` runs, one run per seed: ours against vLLM.

    python -m load_tests.peer_ratios DIR [DIR ...]     # each DIR holds one run's summary.json

Per seed, from the same run, every pair below whose two configurations the run holds: TTFT
p50/p95/p99 ratio = baseline TTFT / subject TTFT (above 1: the subject is faster). Then the median
and min-max over seeds (the figures of docs/results.md, "Ours against vLLM"). vLLM-NS is
`Generate` on the `default` service, or on the `fcfs` one where the run had only that
(`--policies fcfs`: the baseline runs in the first configuration). A run with several `--qps` is
split by QPS: each pair is taken within one QPS.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

PCTS = ("p50", "p95", "p99")
NAMES = {("vllm", "default", True): "vLLM-S", ("vllm", "fcfs", True): "vLLM+fcfs",
         ("native", "fcfs", True): "native fcfs-S", ("native", "default", True): "native default-S"}
# (subject, baseline): the question each pair answers
PAIRS = [("vLLM+fcfs", "vLLM-S"), ("vLLM+fcfs", "vLLM-NS"), ("vLLM+fcfs", "native fcfs-S"),
         ("native fcfs-S", "vLLM-S"), ("native fcfs-S", "vLLM-NS"), ("native fcfs-S", "native-NS")]


def configs(directory: Path) -> dict[float | None, dict[str, dict[str, Any]]]:
    """Each QPS's configurations by name."""
    by_qps: dict[float | None, dict[str, dict[str, Any]]] = {}
    for c in json.loads((directory / "summary.json").read_text())["configs"]:
        out = by_qps.setdefault(c.get("qps"), {})
        key = (c.get("engine", "native"), c["policy"], c["streaming"])
        if key in NAMES:
            out[NAMES[key]] = c
        elif not c["streaming"]:
            name = "vLLM-NS" if key[0] == "vllm" else "native-NS"
            if name not in out or key[1] == "default":
                out[name] = c
    return by_qps


def main(dirs: list[str]) -> None:
    per: dict[str, list[float]] = {}
    runs = [(d, qps, cs) for d in dirs for qps, cs in configs(Path(d)).items()]
    several = len({qps for _, qps, _ in runs}) > 1
    for d, qps, cs in runs:
        at = f" qps={qps:g}" if several else ""
        print(f"{d}{at}: " + "; ".join(f"{name} " + "/".join(f"{c['ttft_s'][p]:.3f}" for p in PCTS)
                                     + f" ({c['requests']} ok, {c.get('failed', 0)} failed,"
                                       f" completion {c['trace_completion_s']:.0f} s)"
                                     for name, c in cs.items()))
        cells = []
        for subject, baseline in PAIRS:
            if subject in cs and baseline in cs:
                for p in PCTS:
                    r = cs[baseline]["ttft_s"][p] / cs[subject]["ttft_s"][p]
                    per.setdefault(f"{subject} vs {baseline}{at} {p}", []).append(r)
                    cells.append(f"{subject} vs {baseline} {p} {r:.2f}x")
        print("    " + ", ".join(cells))
    print(f"median (min-max) over {len(dirs)} seed(s):")
    for key, r in per.items():
        print(f"    {key}: {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")


if __name__ == "__main__":
    main(sys.argv[1:])
