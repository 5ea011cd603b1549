"""The corpus server's site search: BM25 over the site's pages, answered as JSON at /search."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

from retriever_svc.corpus.extract import Page, Section
from retriever_svc.corpus.relevance import QueryScorer, terms
from retriever_svc.corpus.site_search import (
    MAX_LIMIT,
    MAX_QUERY_CHARS,
    SearchRequestError,
    SiteSearch,
    parse_search_request,
)
from retriever_svc.corpus.web_server import CorpusServer
from tests.retriever import http_get


def test_terms_drop_question_filler_and_stem_but_keep_identifiers() -> None:
    assert terms("How do I use the lru_cache of functools?") == ["lru_cach", "functool"]
    assert terms("Reading files, read a FILE") == ["read", "file", "read", "file"]
    assert terms("what is __init__.py for") == ["__init__", "py"]


def test_relevance_is_a_share_weighted_by_idf() -> None:
    plain = QueryScorer("buffered file writes")
    assert plain.relevance("") == 0.0
    assert 0 < plain.relevance("a buffered file") < plain.relevance("buffered writes go to the file") < 1
    weighted = QueryScorer("buffered file writes", weights={"buffer": 2.0, "file": 0.1, "write": 1.0})
    assert weighted.relevance("the file") < weighted.relevance("a buffer")     # a rare term counts more
    assert weighted.coverage("buffer and file") == pytest.approx(2.1 / 3.1)
    assert QueryScorer("how do I do it").relevance("anything at all") == 0.0    # no content words


def test_pages_rank_by_bm25_with_titles_counting_more() -> None:
    index = SiteSearch([
        Page("a.html", "Buffering", [Section("Buffering", "", "Writes are collected in memory.")]),
        Page("b.html", "Files", [Section("Files", "", "Open a file. Buffering is mentioned once here.")]),
        Page("c.html", "Lists", [Section("Lists", "", "A list holds items.")]),
    ])
    result = index.search("how does buffering work")
    assert [h.url for h in result.hits] == ["a.html", "b.html"]           # c.html matches nothing
    assert result.hits[0].score > result.hits[1].score > 0
    assert result.hits[0].title == "Buffering"
    assert set(result.idf) == {"buffer"} and result.idf["buffer"] > 0     # "work" is on no page: left out
    assert index.search("buffering", limit=1).hits == result.hits[:1]
    assert index.search("zebra").hits == []


def test_the_tiny_sites_search_finds_the_buffering_page_first(tiny_corpus: Path) -> None:
    index = SiteSearch.build(tiny_corpus)
    assert index.page_count == 5
    assert index.search("when are buffered writes flushed").hits[0].url == "io/buffering.html"


def test_search_answers_json_with_hits_relative_to_the_site(corpus: CorpusServer) -> None:
    query = quote("flush buffered writes to the file")
    status, content_type, body = http_get(corpus, f"/search?q={query}&limit=2")
    assert status == 200 and content_type == "application/json; charset=utf-8"
    answer = json.loads(body)
    assert answer["query"] == "flush buffered writes to the file" and answer["pages"] == 5
    assert [h["url"] for h in answer["hits"]] == ["io/buffering.html", "files.html"]
    assert all(h["score"] > 0 and h["title"] for h in answer["hits"])
    assert set(answer["terms"]) == {"flush", "buffer", "write", "file"}
    assert http_get(corpus, "/" + answer["hits"][0]["url"])[0] == 200           # a hit is a page of this server


@pytest.mark.parametrize("query, message", [
    ("", "give the search terms"),
    ("?q=", "give the search terms"),
    ("?q=%20%20", "give the search terms"),
    ("?q=" + "a" * (MAX_QUERY_CHARS + 1), "the limit is"),
    ("?q=files&limit=0", "limit must be in"),
    (f"?q=files&limit={MAX_LIMIT + 1}", "limit must be in"),
    ("?q=files&limit=many", "limit must be an integer"),
])
def test_bad_search_requests_are_400_with_a_json_error(corpus: CorpusServer, query: str, message: str) -> None:
    status, content_type, body = http_get(corpus, "/search" + query)
    assert status == 400 and content_type.startswith("application/json")
    assert message in json.loads(body)["error"]
    with pytest.raises(SearchRequestError, match=message):
        parse_search_request(query.removeprefix("?"))


def test_a_corpus_server_without_search_answers_404(tiny_corpus: Path) -> None:
    with CorpusServer(tiny_corpus, search=False) as server:
        assert http_get(server, "/search?q=files")[0] == 404
        assert server.search_index is None
        assert http_get(server, "/files.html")[0] == 200


def test_serve_corpus_searches_unless_told_not_to() -> None:
    import argparse

    from retriever_svc.corpus.web_server import add_serve_corpus_args

    parser = argparse.ArgumentParser()
    add_serve_corpus_args(parser)
    assert parser.parse_args([]).search is True
    assert parser.parse_args(["--no-search"]).search is False
