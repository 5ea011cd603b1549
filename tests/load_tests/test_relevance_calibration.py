"""`streamrag bench relevance`: replaying the crawler's relevance threshold and merge margin
from one crawl that kept every page; end to end against a real crawler on a small site."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from load_tests.relevance_calibration import (
    CrawledPage,
    add_bench_relevance_args,
    margin_row,
    run_bench_relevance,
    threshold_row,
)
from retriever_svc.corpus.web_server import CorpusServer
from retriever_svc.crawler import CrawlerBackend
from tests.retriever.test_crawler_search import FLUSH_QUERY, flush_site, settings_for
from tests.support.retrievers import serving_retriever

CRAWLS = [
    [CrawledPage("a.html", 0.9, False), CrawledPage("b.html", 0.3, True), CrawledPage("c.html", 0.1, False)],
    [CrawledPage("d.html", 0.15, True), CrawledPage("e.html", 0.6, False)],
]


def test_a_threshold_keeps_the_pages_at_or_above_it_in_crawl_order():
    assert threshold_row(CRAWLS, 0.0, top_k=5) == {"threshold": 0.0, "hit_at_k": 1.0, "pages_mean": 2.5,
                                                  "non_answering_mean": 1.5, "empty": 0}
    assert threshold_row(CRAWLS, 0.2, top_k=5)["hit_at_k"] == 0.5          # d.html (0.15) is dropped
    assert threshold_row(CRAWLS, 0.0, top_k=1)["hit_at_k"] == 0.5          # b.html is second in its crawl
    assert threshold_row(CRAWLS, 0.95, top_k=5)["empty"] == 2


def test_a_page_moves_forward_only_past_a_page_it_beats_by_more_than_the_margin():
    assert margin_row(CRAWLS, 0.0, 5, 0.0) == {"margin": 0.0, "moved_share": 0.2, "moved_answering": 0, "pages": 5}
    assert margin_row(CRAWLS, 0.0, 5, 0.5)["moved_share"] == 0.0           # e.html beats d.html by 0.45 only


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_relevance_args(parser)
    return parser.parse_args(list(argv))


async def test_the_calibration_crawls_a_real_crawler_and_finds_the_answering_page(tmp_path: Path, capsys):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"id": "flush", "section": "library", "question": FLUSH_QUERY,
                                     "pages": ["target.html"]}) + "\n")
    out = tmp_path / "relevance.json"
    with CorpusServer(flush_site(tmp_path / "site")) as corpus:
        settings = settings_for(corpus, tmp_path, seeds=1, concurrency=1, min_relevance=0.0)
        async with serving_retriever(CrawlerBackend(settings), "crawler") as crawler:
            args = bench_args("--questions", str(questions), "--crawler", crawler.address, "--pages", "10",
                              "--json", str(out))
            assert await asyncio.to_thread(run_bench_relevance, args) == 0
    result = json.loads(out.read_text())
    crawl = result["crawls"]["flush"]
    assert any(p["page"] == "target.html" and p["answers"] for p in crawl)
    assert result["thresholds"][0] == {**result["thresholds"][0], "threshold": 0.0, "hit_at_k": 1.0}
    assert "| min_relevance |" in capsys.readouterr().out


async def test_a_crawler_that_drops_pages_is_refused_with_what_to_do(tmp_path: Path, capsys):
    questions = Path(__file__).resolve().parents[2] / "load_tests" / "quality_questions.jsonl"
    with CorpusServer(flush_site(tmp_path / "site")) as corpus:
        settings = settings_for(corpus, tmp_path)       # the default threshold
        async with serving_retriever(CrawlerBackend(settings), "crawler") as crawler:
            args = bench_args("--questions", str(questions), "--crawler", crawler.address)
            assert await asyncio.to_thread(run_bench_relevance, args) == 2
    assert "--min-relevance 0" in capsys.readouterr().err
