"""`streamrag bench report`: the results page, docs/results.md, and its plots, from the summaries.

Each section of the page is one claim. Its numbers live in one summary file,
`docs/results/<section>.json`: exactly the figures the page shows, the command that produced
them, the machine kind and the seeds, and for each target the reason a miss is a miss. The prose
that does not come from numbers (what a section measures, the column names) lives in the
templates of load_tests/results_sections.py (the page's frame), results_serving.py and
results_engine.py, so the page is regenerated, never edited, and its prose cannot drift from its
rows:

    streamrag bench report
    streamrag bench report --out /tmp/page.md --no-plots

Whether a target is met is decided here from the measured value, so a refreshed summary moves
the verdict with it. In a target, `measured` (and `worst`) may name a value of the same summary
instead of repeating it: `"@sweep/rows/anns-0.333/speedup/p95"`, or `"@min PATH, PATH..."` for
the lowest of several (`*` stands for every item); a list is indexed by position or by its items'
`id`. A summary that lacks a key the page needs stops the command with the file and the key,
before anything is written. The plots are drawn by load_tests/results_plots.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from load_tests import results_plots
from load_tests.results_sections import PAGE, SECTIONS
from load_tests.results_summary import Node, SummaryError

DOCS = Path(__file__).resolve().parents[1] / "docs"


# ---------------------------------------------------------------------------- command

def load_summaries(directory: Path) -> dict[str, Node]:
    summaries = {}
    for name in SECTIONS:
        path = directory / f"{name}.json"
        try:
            summaries[name] = Node(json.loads(path.read_text(encoding="utf-8")), f"{path}:")
        except FileNotFoundError:
            raise SummaryError(f"{path}: missing (every section of the page needs its summary)") from None
        except json.JSONDecodeError as err:
            raise SummaryError(f"{path}: not valid JSON ({err})") from None
    return summaries


def render_page(summaries: dict[str, Node]) -> str:
    lines = [line for section in PAGE for line in section(summaries)]
    return "\n".join(lines).rstrip("\n") + "\n"


def add_bench_report_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--summaries", type=Path, default=DOCS / "results",
                        help="directory of the section summaries (default: docs/results)")
    parser.add_argument("--out", type=Path, default=DOCS / "results.md",
                        help="the page to write (default: docs/results.md); plots go to results/ beside it")
    parser.add_argument("--no-plots", action="store_true", help="write the page only")


def run_bench_report(args: argparse.Namespace) -> int:
    try:
        summaries = load_summaries(args.summaries)
        page = render_page(summaries)
        plots = [] if args.no_plots else results_plots.write_plots(summaries, args.out.parent / "results")
    except SummaryError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page, encoding="utf-8")
    print(f"wrote {args.out} ({page.count(chr(10))} lines)" + "".join(f", {p}" for p in plots))
    return 0
