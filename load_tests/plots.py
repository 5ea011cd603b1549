"""The replay benchmark's figures (PNG), drawn from its per-request records.

Per workload, the shapes of the Stream2LLM paper's figures:

- `ttft_ccdf_<workload>.png`: TTFT CCDF, one panel per QPS, one curve per configuration
  (paper Figure 8);
- `ttft_vs_qps_<workload>.png`: TTFT p50 and p95 against QPS, one line per configuration
  (paper Figure 9);
- `invalidated_ccdf_<workload>.png` (update workloads only): tokens invalidated per request,
  CCDF, one panel per QPS (paper Figure 11).

`write_plots(records, out_dir)` returns the files it wrote. matplotlib is imported only here
and uses its file-only backend.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from load_tests.runner import pyplot, save_figure
from servicekit.stats import percentile

Record = Mapping[str, Any]


def config_label(record: Record, engines: int = 1) -> str:
    """How a configuration is named in legends: `fcfs/cost streaming`, `vllm non-streaming`..."""
    mode = "streaming" if record["streaming"] else "non-streaming"
    name = f"{record['policy']}/{record['eviction']} {mode}"
    return f"{record['engine']} {name}" if engines > 1 else name


def _ordered(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def ccdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Points (x, P[X >= x]) of the empirical complementary CDF, x ascending."""
    xs = sorted(values)
    n = len(xs)
    return xs, [(n - i) / n for i in range(n)]


def _ok(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r.get("error") is None and r.get("ttft_s") is not None]


def _grouped(records: Sequence[Record], engines: int) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(config_label(r, engines), []).append(r)
    return out


def _panels(plt: Any, count: int, title: str) -> tuple[Any, list[Any]]:
    cols = min(count, 4)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    fig.suptitle(title)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _style(label: str) -> dict[str, Any]:
    return {"linestyle": "--" if "non-streaming" in label else "-", "linewidth": 1.4}


def _ccdf_figure(plt: Any, records: Sequence[Record], workload: str, qps_levels: Sequence[float], engines: int,
                 value: str, xlabel: str, title: str, log_x: bool) -> Any:
    fig, axes = _panels(plt, len(qps_levels), title)
    for ax, qps in zip(axes, qps_levels, strict=True):
        at = [r for r in records if r["qps"] == qps]
        for label, group in _grouped(at, engines).items():
            xs, ys = ccdf([float(r[value]) for r in group])
            if log_x:
                xs = [max(x, 1e-4) for x in xs]
            ax.step(xs, ys, where="post", label=label, **_style(label))
        ax.set_title(f"{workload}, QPS {qps:g}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of requests ≥ x")
        ax.set_yscale("log")
        if log_x:
            ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _qps_figure(plt: Any, records: Sequence[Record], workload: str, qps_levels: Sequence[float],
                engines: int) -> Any:
    fig, axes = _panels(plt, 2, f"{workload}: TTFT against load")
    for ax, (name, q) in zip(axes, (("p50", 50.0), ("p95", 95.0)), strict=True):
        for label, group in _grouped(records, engines).items():
            points = [(qps, percentile([r["ttft_s"] for r in group if r["qps"] == qps], q)) for qps in qps_levels]
            points = [(x, y) for x, y in points if math.isfinite(y)]
            if points:
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label, **_style(label))
        ax.set_title(f"TTFT {name}")
        ax.set_xlabel("QPS")
        ax.set_ylabel("seconds")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_plots(records: Sequence[Record], out_dir: Path, update_workloads: Iterable[str] = ()) -> list[Path]:
    """Draw every figure for `records` (the rows of requests.jsonl) into `out_dir`."""
    plt = pyplot()
    ok = _ok(records)
    engines = len(_ordered(r["engine"] for r in ok))
    updates = set(update_workloads)
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        written.append(save_figure(fig, out_dir / name))

    for workload in _ordered(r["workload"] for r in ok):
        mine = [r for r in ok if r["workload"] == workload]
        qps_levels = sorted(_ordered(r["qps"] for r in mine))
        save(_ccdf_figure(plt, mine, workload, qps_levels, engines, "ttft_s", "TTFT (s, from the last chunk)",
                          f"{workload}: TTFT CCDF", log_x=True), f"ttft_ccdf_{workload}.png")
        save(_qps_figure(plt, mine, workload, qps_levels, engines), f"ttft_vs_qps_{workload}.png")
        if workload in updates:
            streamed = [r for r in mine if r["streaming"]]
            if streamed:
                save(_ccdf_figure(plt, streamed, workload, qps_levels, engines, "tokens_invalidated",
                                  "tokens invalidated per request", f"{workload}: tokens invalidated CCDF",
                                  log_x=False), f"invalidated_ccdf_{workload}.png")
    return written
