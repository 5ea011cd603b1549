"""The results page's plots (PNG), drawn from the same summaries as its tables (load_tests/results_page.py).

One figure per section: the streaming speedup against load, against vLLM by CPU kind, by
eviction mode under memory pressure, a session query's TTFT against context size, decode speed
against concurrency, the ANNS early results' recall against time, passage KV reuse's quality
against speed, prefill speed against prompt length, and decode ITL and goodput of disaggregated
prefill/decode against colocated by load. matplotlib is
imported only when the plots are written, with its file-only backend; PNGs stay small (dpi 80)
and carry no software version, so the same summaries give the same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from load_tests.runner import pyplot, save_figure

if TYPE_CHECKING:
    from load_tests.results_summary import Node

DPI = 80


def plot_streaming(s: dict[str, Node], plt: Any) -> Any:
    rows = s["streaming"]["sweep"]["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3), sharey=False)
    for ax, workload in zip(axes, ("crawler", "ANNS"), strict=True):
        mine = [r for r in rows if str(r["workload"]).startswith(workload)]
        qps = [r["paper_qps"].number() for r in mine]
        for p, marker in (("p50", "o"), ("p95", "s"), ("p99", "^")):
            cells = [r["speedup"][p] for r in mine]
            mid = [c["median"].number() for c in cells]
            err = [[m - c["min"].number() for m, c in zip(mid, cells, strict=True)],
                   [c["max"].number() - m for m, c in zip(mid, cells, strict=True)]]
            ax.errorbar(qps, mid, yerr=err, marker=marker, capsize=3, label=p)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        first = mine[0]["queries"].number()
        ax.set_xticks(qps, [f"{q:g}" + (f"\n({r['queries']} queries)" if r["queries"].number() != first else "")
                            for q, r in zip(qps, mine, strict=True)])
        ax.set_title(f"{workload} (speedup, median and min-max)")
        ax.set_xlabel("paper QPS")
    axes[0].legend()
    return fig


def plot_sessions(s: dict[str, Node], plt: Any) -> Any:
    rows = list(s["sessions"]["bench"]["rows"])
    x = [r["context_tokens"].number() for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for key, label in (("session", "session query"), ("prefix_cache", "our prefix cache (warm)"),
                       ("vllm_prefix_cache", "vLLM prefix cache"), ("generate", "Generate (cold)")):
        cells = [r[key] for r in rows]
        ax.plot(x, [c["median"].number() for c in cells], marker="o", label=label)
        ax.fill_between(x, [c["min"].number() for c in cells], [c["max"].number() for c in cells], alpha=0.2)
    ax.set_yscale("log")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("TTFT ms")
    ax.legend(fontsize=8)
    return fig


def plot_decode(s: dict[str, Node], plt: Any) -> Any:
    rows = s["decode"]["grid"]["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3), sharey=True)
    for ax, workload in zip(axes, ("rag", "free"), strict=True):
        for mode in ("2", "4", "8", "auto"):
            mine = [r for r in rows if r["workload"].value == workload and r["mode"].value == mode]
            conc = [r["concurrency"].number() for r in mine]
            mid = [r["vs_off"]["median"].number() for r in mine]
            err = [[m - r["vs_off"]["min"].number() for m, r in zip(mid, mine, strict=True)],
                   [r["vs_off"]["max"].number() - m for m, r in zip(mid, mine, strict=True)]]
            ax.errorbar(conc, mid, yerr=err, marker="o", capsize=3, label="auto" if mode == "auto" else f"k = {mode}")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(conc, [f"{c:g}" for c in conc])
        ax.set_title(f"{workload}: decode tokens/s against off")
        ax.set_xlabel("requests decoding together")
    axes[0].legend(fontsize=8)
    return fig


def _bars(ax: Any, groups: list[str], series: dict[str, list[Any]]) -> None:
    """Grouped bars of speedup cells (median with min-max whiskers) and the parity line."""
    width = 0.8 / len(series)
    for i, (label, cells) in enumerate(series.items()):
        x = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        mid = [c["median"].number() for c in cells]
        err = [[m - c["min"].number() for m, c in zip(mid, cells, strict=True)],
               [c["max"].number() - m for m, c in zip(mid, cells, strict=True)]]
        ax.bar(x, mid, width, yerr=err, capsize=2, label=label)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)


def plot_vllm(s: dict[str, Node], plt: Any) -> Any:
    rows = list(s["vllm"]["by_kind"]["rows"])
    fig, axes = plt.subplots(1, 2, figsize=(8, 3), sharey=True)
    for ax, key, title in zip(axes, ("vs_ns", "vs_s"), ("against vLLM-NS", "against vLLM-S"), strict=True):
        _bars(ax, [str(r["kind"]) for r in rows], {p: [r[key][p] for r in rows] for p in ("p50", "p95", "p99")})
        ax.set_title(f"our streaming {title} (speedup)")
    axes[0].legend(fontsize=8)
    return fig


def plot_pressure(s: dict[str, Node], plt: Any) -> Any:
    rows = list(s["pressure"]["fcfs"]["rows"])
    fig, ax = plt.subplots(figsize=(6, 3))
    _bars(ax, [f"{r['workload']}\n{r['eviction']}" for r in rows],
          {p: [r["speedup"][p] for r in rows] for p in ("p50", "p95", "p99")})
    ax.set_title("under memory pressure: speedup over not streaming")
    ax.legend(fontsize=8)
    return fig


def plot_retrieval(s: dict[str, Node], plt: Any) -> Any:
    rows = list(s["retrieval"]["anns"]["rows"])
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["p50_ms"].number() for r in rows], [r["recall"].number() for r in rows], marker="o")
    for r in rows:
        ax.annotate(f"L = {r['L']}", (r["p50_ms"].number(), r["recall"].number()), fontsize=8,
                    textcoords="offset points", xytext=(4, -10))
    ax.set_xlabel("time since the search started, p50 ms")
    ax.set_ylabel("recall@10 of the list emitted")
    ax.set_title("ANNS early results")
    return fig


def plot_engine(s: dict[str, Node], plt: Any) -> Any:
    rows = list(s["engine"]["prefill"]["rows"])
    x = [r["tokens"].number() for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(x, [r["ours"].number() for r in rows], marker="o", label="ours")
    ax.plot(x, [r["hf"].number() for r in rows], marker="s", label="transformers")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{t:g}" for t in x])
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("prefill tokens/s")
    ax.legend(fontsize=8)
    return fig


def plot_blend(s: dict[str, Node], plt: Any) -> Any:
    rows = list(s["blend"]["sweep"])
    x = [r["ttft_speedup"]["median"].number() for r in rows]
    y = [100 * r["answer_agreement"]["median"].number() for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(x, y, marker="o")
    for r, xi, yi in zip(rows, x, y, strict=True):
        ax.annotate(f"{r['fraction'].number():g}", (xi, yi), fontsize=8, textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("TTFT speedup over exact (median)")
    ax.set_ylabel("answers equal to exact, %")
    ax.set_title("blend: quality against speed by recomputed share")
    return fig


def plot_disagg(s: dict[str, Node], plt: Any) -> Any:
    rows = list(s["disagg"]["rows"])
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    panels = ((axes[0], "itl_p99_ms", "decode ITL p99 ms"), (axes[1], "goodput_rps", "goodput requests/s"))
    for ax, key, label in panels:
        for mode, marker in (("colocated", "o"), ("disaggregated", "s")):
            mine = [r for r in rows if str(r["mode"]) == mode]
            x = [r["rate_rps"].number() for r in mine]
            cells = [r[key] for r in mine]
            ax.plot(x, [c["median"].number() for c in cells], marker=marker, label=mode)
            ax.fill_between(x, [c["min"].number() for c in cells], [c["max"].number() for c in cells], alpha=0.2)
        ax.set_xlabel("offered requests/s")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    axes[1].plot(axes[1].get_xlim(), axes[1].get_xlim(), color="grey", linestyle="--", linewidth=1)
    return fig


PLOTS = {"streaming": plot_streaming, "vllm": plot_vllm, "pressure": plot_pressure, "sessions": plot_sessions,
         "decode": plot_decode, "retrieval": plot_retrieval, "blend": plot_blend, "engine": plot_engine,
         "disagg": plot_disagg}


def write_plots(s: dict[str, Node], out_dir: Path) -> list[Path]:
    """Draw every plot first (a missing key stops before any file is written), then save them."""
    plt = pyplot()
    figures = {name: draw(s, plt) for name, draw in PLOTS.items()}
    paths = []
    for name, fig in figures.items():
        fig.tight_layout()
        paths.append(save_figure(fig, out_dir / f"{name}.png", dpi=DPI, metadata={"Software": None}))
    return paths
