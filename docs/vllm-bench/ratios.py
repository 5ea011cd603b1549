"""Issue 16's ratios from `bench replay --engine vllm --policies default,fcfs` runs, one per seed.

    python docs/vllm-bench/ratios.py DIR [DIR ...]     # each DIR holds one run's summary.json

Per seed, from the same run: vLLM + our fcfs (streaming) against vLLM-S (policy default,
streaming) and against vLLM-NS (policy default, non-streaming), TTFT p50/p95/p99 (ratio =
baseline TTFT / fcfs TTFT: above 1 means fcfs is faster). Then the median and min-max over seeds.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

PCTS = ("p50", "p95", "p99")


def configs(directory: Path) -> dict[tuple, dict]:
    out = {}
    for c in json.loads((directory / "summary.json").read_text())["configs"]:
        out[(c.get("engine"), c["policy"], c["streaming"])] = c
    return out


def main(dirs: list[str]) -> None:
    per: dict[str, dict[str, list[float]]] = {}
    for d in dirs:
        cs = configs(Path(d))
        fcfs = cs[("vllm", "fcfs", True)]["ttft_s"]
        base = {"vLLM-S": cs[("vllm", "default", True)]["ttft_s"], "vLLM-NS": cs[("vllm", "default", False)]["ttft_s"]}
        cells = []
        for name, b in base.items():
            for p in PCTS:
                r = b[p] / fcfs[p]
                per.setdefault(f"{name} {p}", {}).setdefault("r", []).append(r)
                cells.append(f"{name} {p} {r:.2f}x")
        ttfts = "; ".join(f"{k[1]}{'-S' if k[2] else '-NS'} " + "/".join(f"{c['ttft_s'][p]:.2f}" for p in PCTS)
                          + f" (completion {c['trace_completion_s']:.0f} s)"
                          for k, c in cs.items())
        print(f"{d}: {ttfts}\n    " + ", ".join(cells))
    if len(dirs) > 1:
        print("median (min-max) over seeds:")
        for key, v in per.items():
            r = v["r"]
            print(f"    fcfs vs {key}: {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")


if __name__ == "__main__":
    main(sys.argv[1:])
