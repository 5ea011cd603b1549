"""The plot of `bench sessions`: time to first token against context size, one curve per path."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from load_tests.runner import pyplot, save_figure


def write_plot(points: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    series = (("generate_ttft_ms", "Generate (cold prefill)", "s-"),
              ("prefix_cache_ttft_ms", "Generate, prefix cache (warm)", "^-"),
              ("vllm_prefix_cache_ttft_ms", "vLLM prefix cache (warm)", "v--"),
              ("session_query_ttft_ms", "session query", "o-"),
              ("flash_hit_ms", "Flash hit (client)", "d-"))
    fig, ax = pyplot().subplots(figsize=(7.5, 4.8))
    for key, label, style in series:
        shown = [p for p in points if p.get(key) is not None]
        if not shown:
            continue
        xs = [p["context_tokens"] for p in shown]
        ys = [p[key] for p in shown]
        err = [[p[key] - p.get(f"{key}_min", p[key]) for p in shown],
               [p.get(f"{key}_max", p[key]) - p[key] for p in shown]]
        ax.errorbar(xs, ys, yerr=err, fmt=style, capsize=3, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("context tokens (instructions + data)")
    ax.set_ylabel("time to first token, ms (log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
