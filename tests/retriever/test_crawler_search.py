"""The crawler seeded from the site search: relevance-first, irrelevant pages dropped, repeats
deduplicated by page and by block, search hits held to the same URL policy as links, and a
search that cannot answer ends the retrieval with UNAVAILABLE."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest

from retriever_svc.corpus.web_server import CorpusServer
from retriever_svc.crawler import CrawlerBackend, CrawlerSettings, PageSelector, crawl_documents, parse_search_answer
from retriever_svc.crawler.url_policy import UrlPolicy, UrlRefused
from tests.retriever.test_crawler import assert_well_formed, kept_paths, retrieve

FLUSH_QUERY = "when are buffered writes flushed to the file"
FILLER = ("The cafeteria opens at noon and closes at three.\n\nParking is free for visitors on weekends.\n\n"
          "The library lends umbrellas when it rains.\n\nTea and coffee are served in the main hall.")


def page(title: str, body: str, links: list[tuple[str, str]] = ()) -> str:
    anchors = "\n".join(f'<li><a href="{href}">{text}</a></li>' for href, text in links)
    paragraphs = "\n".join(f"<p>{p}</p>" for p in body.split("\n\n"))
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body><div class=\"body\">"
            f"<h1>{title}</h1>\n{paragraphs}\n<ul>{anchors}</ul></div></body></html>")


def write_site(root: Path, pages: dict[str, str]) -> Path:
    for name, html in pages.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(html, encoding="utf-8")
    return root


def flush_site(root: Path) -> Path:
    """start.html is the top search hit; target.html is two links from it (via flushing.html);
    complaints.html and cabinets.html hang off start.html too, behind links that only say "file"."""
    return write_site(root, {
        "start.html": page("Buffered writes and flushing",
                           "Buffered writes are kept in memory and flushed to the file later. Flushing buffered "
                           "writes happens on close, and buffered writes are flushed when the buffer is full.",
                           [("complaints.html", "File a complaint"), ("cabinets.html", "File cabinets"),
                            ("flushing.html", "Flushing buffered writes")]),
        "flushing.html": page("Flush", "Calling flush() pushes buffered data to the operating system.",
                              [("target.html", "When buffered writes reach the file"), ("start.html", "Back")]),
        "target.html": page("Durability", "Buffered writes reach the file on disk only after a flush and fsync."),
        "complaints.html": page("Complaints", "How to file a complaint about the cafeteria menu and its prices."),
        "cabinets.html": page("Cabinets", "Filing cabinets come in many sizes, colours and materials."),
    })


def settings_for(corpus: CorpusServer, tmp_path: Path, **overrides) -> CrawlerSettings:
    return CrawlerSettings(start_urls=(corpus.index_url,), work_dir=tmp_path / "crawl4ai", **overrides)


def fetched(corpus: CorpusServer) -> list[str]:
    return [r.path.split("?", 1)[0] for r in corpus.requests]


async def test_the_crawl_starts_from_the_search_not_the_site_root(tiny_corpus, tmp_path) -> None:
    with CorpusServer(tiny_corpus) as corpus:
        chunks = await retrieve(settings_for(corpus, tmp_path))
        paths = fetched(corpus)
    assert_well_formed(chunks)
    assert sorted(kept_paths(chunks)) == ["files.html", "io/buffering.html"]
    assert paths[0] == "/search"
    assert "/lists.html" not in paths and "/dicts.html" not in paths      # neither a hit nor a relevant link
    assert all(0 < d.score < 1 for c in chunks for d in c.documents)     # relevance, 0..1


async def test_a_page_two_links_from_a_search_hit_comes_before_unrelated_pages(tmp_path) -> None:
    with CorpusServer(flush_site(tmp_path / "site")) as corpus:
        assert corpus.search_index.search(FLUSH_QUERY).hits[0].url == "start.html"
        chunks = await retrieve(settings_for(corpus, tmp_path, seeds=1, concurrency=1), query=FLUSH_QUERY, top_k=10)
        paths = fetched(corpus)
    assert paths[:4] == ["/search", "/start.html", "/flushing.html", "/target.html"]
    assert set(paths[4:]) == {"/complaints.html", "/cabinets.html"}      # followed last, "file" is all they share
    kept = kept_paths(chunks)
    assert kept[0] == "start.html" and "target.html" in kept
    assert not {"complaints.html", "cabinets.html"} & set(kept)          # fetched, and dropped as irrelevant


async def test_pages_below_the_relevance_threshold_are_dropped(tmp_path) -> None:
    with CorpusServer(flush_site(tmp_path / "site")) as corpus:
        results = {}
        for threshold in (CrawlerSettings.min_relevance, 0.0):
            settings = settings_for(corpus, tmp_path, seeds=5, min_relevance=threshold)
            policy = UrlPolicy.for_start_urls(settings.start_urls)
            urls: list[str] = []
            counts = await crawl_documents(settings, policy, FLUSH_QUERY, lambda d, urls=urls: urls.append(d.url))
            results[threshold] = counts, {u.rsplit("/", 1)[1] for u in urls}
    counts, kept = results[CrawlerSettings.min_relevance]
    assert counts["fetched"] == 5 and counts["irrelevant"] == 2          # complaints and cabinets: "file" alone
    assert kept == {"start.html", "flushing.html", "target.html"}
    assert results[0.0][0]["irrelevant"] == 0


class FakeResult:
    """What PageSelector reads from a crawl4ai result."""

    def __init__(self, url: str, raw: str, fit: str, success: bool = True) -> None:
        self.url, self.redirected_url, self.success, self.error_message = url, None, success, ""
        self.metadata = {"title": url.rsplit("/", 1)[1]}
        self.markdown = type("Markdown", (), {"raw_markdown": raw, "fit_markdown": fit})()


def test_relevance_is_judged_on_the_whole_page_and_weighted_by_the_sites_idf(tmp_path) -> None:
    settings = CrawlerSettings(work_dir=tmp_path)
    weights = {"buffer": 2.0, "write": 1.5, "flush": 2.0, "file": 0.2}
    selector = PageSelector(FLUSH_QUERY, settings, weights)
    about = "Buffered writes are flushed to the file when the buffer is full or on flush()."
    assert selector.select(FakeResult("http://s/a.html", about * 3, about)).score > settings.min_relevance
    passing = "This page is about gardening. " * 60 + "It mentions a file once. " + "Roses need sun. " * 60
    assert selector.select(FakeResult("http://s/b.html", passing, "It mentions a file once, in passing.")) is None
    common = "file " * 40                                   # only the word every page of the site has
    assert selector.select(FakeResult("http://s/c.html", common, "file file file file file file file")) is None
    assert selector.select(FakeResult("http://s/d.html", about, about, success=False)) is None
    assert selector.counts == {"fetched": 4, "failed": 1, "irrelevant": 2, "empty": 0, "duplicate": 0, "kept": 1}


async def test_text_an_earlier_page_sent_is_not_sent_again(tmp_path) -> None:
    shared = "Buffered writes are flushed to the file when the buffer fills up or the file is closed."
    site = write_site(tmp_path / "site", {
        "a.html": page("Buffered writes", f"{shared}\n\nA flush of buffered writes can also be asked for.\n\n{FILLER}"),
        "b.html": page("Flushing writes", f"{shared}\n\nLine buffering flushes buffered writes at each newline."
                                          f"\n\n{FILLER}"),
    })
    with CorpusServer(site) as corpus:
        chunks = await retrieve(settings_for(corpus, tmp_path, concurrency=1), query=FLUSH_QUERY)
    docs = [d for c in chunks for d in c.documents]
    assert len(docs) == 2
    assert sum(shared in d.text for d in docs) == 1                      # the shared paragraph, once
    assert "asked for" in " ".join(d.text for d in docs) and "each newline" in " ".join(d.text for d in docs)


class FakeSearch:
    """A search endpoint that answers whatever the test sets: status, content type, body."""

    def __init__(self, status: int = 200, body: bytes | dict = b"{}", content_type: str = "application/json",
                 headers: dict[str, str] | None = None) -> None:
        self.status, self.content_type, self.headers = status, content_type, headers or {}
        self.body = json.dumps(body).encode() if isinstance(body, dict) else body
        self.queries: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.queries.append(self.path)
                self.send_response(fake.status)
                self.send_header("Content-Type", fake.content_type)
                for key, value in fake.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(fake.body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/search"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FakeSearch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def corpus(tiny_corpus: Path) -> Iterator[CorpusServer]:
    with CorpusServer(tiny_corpus, search=False) as server:
        yield server


async def test_search_hits_pass_the_allow_list_and_the_address_guard(corpus, tmp_path) -> None:
    with CorpusServer(corpus.root, search=False) as other:
        hits = [f"http://127.0.0.1:{other.port}/files.html",            # another port: not on the allow-list
                "http://169.254.169.254/latest/meta-data/",              # link-local, never
                "file:///etc/passwd", "ftp://127.0.0.1/", "http://user:pw@127.0.0.1/",
                f"http://localhost:{other.port}/files.html",             # listed, but resolves to an untrusted loopback
                corpus.url + "files.html"]                               # the one allowed hit
        answer = {"hits": [{"url": u, "score": 1.0} for u in hits], "terms": {"file": 1.0, "flush": 2.0}}
        with FakeSearch(body=answer) as search:
            allow = (f"127.0.0.1:{corpus.port}", search.url.split("/")[2], f"localhost:{other.port}")
            settings = settings_for(corpus, tmp_path, search_url=search.url, allowed_hosts=allow, seeds=10,
                                    min_relevance=0.0)
            chunks = await retrieve(settings)
            assert len(search.queries) == 1
        assert other.request_count == 0
    assert_well_formed(chunks)
    assert kept_paths(chunks)[0] == "files.html"
    assert all(r.path.split("?")[0] in ("/files.html", "/io/buffering.html", "/index.html")
               for r in corpus.requests)


def test_relative_hits_resolve_against_the_search_url_and_scores_become_priorities() -> None:
    policy = UrlPolicy(["127.0.0.1:8765"])
    seeds = parse_search_answer("http://127.0.0.1:8765/search", json.dumps({
        "hits": [{"url": "library/io.html", "score": 8.0}, {"url": "/tutorial/x.html#part", "score": 2.0},
                 {"url": "library/io.html", "score": 1.0}, {"url": "http://evil.example/", "score": 9.0}],
        "terms": {"io": 3.2}}).encode(), policy, limit=5)
    assert seeds.urls == [("http://127.0.0.1:8765/library/io.html", 1.0),
                          ("http://127.0.0.1:8765/tutorial/x.html", 0.25)]
    assert seeds.weights == {"io": 3.2} and seeds.refused == 1


@pytest.mark.parametrize("answer, message", [
    ({"status": 500, "body": {"error": "index corrupt"}}, "HTTP 500: index corrupt"),
    ({"status": 302, "headers": {"Location": "http://169.254.169.254/"}}, "HTTP 302"),
    ({"body": b"<html>not json</html>", "content_type": "text/html"}, "not JSON"),
    ({"body": b"{not json"}, "not a search result"),
    ({"body": {"results": []}}, "not a search result"),
    ({"body": {"hits": [{"url": "a.html", "score": "high"}]}}, "not a search result"),
    ({"body": {"hits": "a.html"}}, "not a search result"),
    ({"body": b"[" + b" " * (300 * 1024) + b"]"}, "more than"),
], ids=["http-500", "redirect", "html", "broken-json", "no-hits", "bad-score", "hits-not-a-list", "too-big"])
async def test_a_search_that_answers_garbage_ends_retrieval_with_unavailable(corpus, tmp_path, answer,
                                                                              message) -> None:
    with FakeSearch(**answer) as fake:
        settings = settings_for(corpus, tmp_path, search_url=fake.url,
                                allowed_hosts=(f"127.0.0.1:{corpus.port}", fake.url.split("/")[2]))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await retrieve(settings)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "site search" in error.value.details() and message in error.value.details()
    assert corpus.request_count == 0


async def test_a_search_that_is_down_ends_retrieval_with_unavailable(corpus, tmp_path) -> None:
    with FakeSearch() as gone:
        down = gone.url
    settings = settings_for(corpus, tmp_path, search_url=down,
                            allowed_hosts=(f"127.0.0.1:{corpus.port}", down.split("/")[2]))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await retrieve(settings)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"site search {down} unreachable" in error.value.details()


async def test_a_query_the_search_finds_nothing_for_ends_with_an_empty_final_chunk(tiny_corpus, tmp_path) -> None:
    with CorpusServer(tiny_corpus) as corpus:
        chunks = await retrieve(settings_for(corpus, tmp_path), query="zebra giraffe")
        assert fetched(corpus) == ["/search"]
    assert len(chunks) == 1 and chunks[0].final and not chunks[0].documents


def test_a_search_url_off_the_allow_list_is_a_configuration_error(tmp_path) -> None:
    with pytest.raises(UrlRefused, match="search URL"):
        CrawlerBackend(CrawlerSettings(start_urls=("http://127.0.0.1:8765/index.html",),
                                       search_url="http://169.254.169.254/search", work_dir=tmp_path))
    backend = CrawlerBackend(CrawlerSettings(start_urls=("http://127.0.0.1:8765/index.html",), work_dir=tmp_path))
    assert backend.settings.resolved_search_url == "http://127.0.0.1:8765/search"
    assert CrawlerSettings(search_url=None, work_dir=tmp_path).resolved_search_url is None


async def test_without_search_the_crawl_starts_at_the_start_urls(tiny_corpus, tmp_path) -> None:
    with CorpusServer(tiny_corpus) as corpus:
        chunks = await retrieve(settings_for(corpus, tmp_path, search_url=None))
        paths = fetched(corpus)
    assert paths[0] == "/index.html" and "/search" not in paths
    assert_well_formed(chunks)
    assert sorted(kept_paths(chunks)) == ["files.html", "io/buffering.html"]
