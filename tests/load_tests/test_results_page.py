"""The results page is generated from its summaries, judges its targets from them, and names no work period."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from load_tests.results_page import DOCS, add_bench_report_args, run_bench_report
from load_tests.results_summary import Node, targets

SUMMARIES = DOCS / "results"
# issue16, session-10, round2, s15 (as a name part): how the work was organised, not what it shows
WORK_PERIOD_NAME = re.compile(r"(issue|session|round)[-_]?\d+|(^|[-_.])s\d{1,2}($|[-_.])", re.IGNORECASE)
WORK_PERIOD_TEXT = re.compile(r"\b(issue|session|round)[ _-]?\d+\b|\bround (one|two|three)\b", re.IGNORECASE)


def report(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_bench_report_args(parser)
    return run_bench_report(parser.parse_args(list(argv)))


def test_the_page_regenerates_byte_identically_from_the_committed_summaries(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    assert report("--summaries", str(SUMMARIES), "--out", str(out), "--no-plots") == 0
    assert out.read_bytes() == (DOCS / "results.md").read_bytes()


def test_the_page_stays_short() -> None:
    assert len((DOCS / "results.md").read_text(encoding="utf-8").splitlines()) <= 400


def test_every_plot_the_page_shows_is_committed_and_is_written_beside_the_page(tmp_path: Path) -> None:
    page = (DOCS / "results.md").read_text()
    shown = re.findall(r"!\[[^\]]*\]\((results/[^)]+\.png)\)", page)
    assert shown and all((DOCS / name).is_file() for name in shown)
    assert report("--summaries", str(SUMMARIES), "--out", str(tmp_path / "results.md")) == 0
    for name in shown:
        assert 0 < (tmp_path / name).stat().st_size < 100_000


@pytest.mark.parametrize(("summary", "path", "key"), [
    ("streaming", ["sweep", "rows", 0], "speedup"),
    ("vllm", ["targets", 1], "reason"),
    ("sessions", [], "bench"),
])
def test_a_summary_missing_a_key_is_refused_with_its_file_and_key(tmp_path: Path, capsys, summary, path, key) -> None:
    summaries = tmp_path / "results"
    shutil.copytree(SUMMARIES, summaries)
    data = json.loads((summaries / f"{summary}.json").read_text())
    node = data
    for step in path:
        node = node[step]
    del node[key]
    (summaries / f"{summary}.json").write_text(json.dumps(data))
    out = tmp_path / "page.md"
    assert report("--summaries", str(summaries), "--out", str(out), "--no-plots") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{summary}.json: missing key" in err and key in err
    assert "Traceback" not in err and not out.exists()


def test_a_missing_summary_file_is_named(tmp_path: Path, capsys) -> None:
    summaries = tmp_path / "results"
    shutil.copytree(SUMMARIES, summaries)
    (summaries / "decode.json").unlink()
    assert report("--summaries", str(summaries), "--out", str(tmp_path / "page.md"), "--no-plots") == 2
    assert "decode.json: missing" in capsys.readouterr().err


def test_a_target_is_met_missed_or_met_only_on_the_median_by_its_measured_value() -> None:
    summary = Node({
        "rows": [{"id": "a", "p99": {"median": 1.2, "min": 0.9, "max": 1.5}}, {"id": "b", "p99": 2.5}],
        "targets": [
            {"what": "a", "target": 1.0, "unit": "x", "measured": "@rows/a/p99", "reason": "one slow seed"},
            {"what": "b", "target": 3.0, "unit": "x", "measured": "@rows/b/p99", "reason": "the bound"},
            {"what": "lowest", "target": 1.0, "unit": "x", "measured": "@min rows/*/p99", "reason": "r"},
            {"what": "gap", "target": 2.0, "unit": "%", "at_most": True, "measured": 0.5},
        ],
    }, "s.json:")
    lines = targets(summary)
    assert lines[0].startswith("- **Met on the median, not in every seed**: a;") and "1.20x (0.90-1.50)" in lines[0]
    assert lines[0].endswith("one slow seed")
    assert lines[1].startswith("- **Missed**: b;") and lines[1].endswith("2.50x. the bound")
    assert "- **Met on the median" in lines[2] and "1.20x" in lines[2]      # the lower of the two medians
    assert lines[3] == "- **Met**: gap (target ≤ 2.0%, measured 0.5%)."


def test_nothing_under_docs_is_named_after_how_the_work_was_organised() -> None:
    for path in DOCS.rglob("*"):
        for part in path.relative_to(DOCS).parts:
            assert not WORK_PERIOD_NAME.search(Path(part).stem + Path(part).suffix), path
        if path.suffix in (".md", ".json"):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                assert not WORK_PERIOD_TEXT.search(line), f"{path}:{number}: {line}"
