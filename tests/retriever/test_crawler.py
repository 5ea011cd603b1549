"""The crawler retriever through a real gRPC server on loopback, crawling a local corpus server.

Server, crawl and client share the test's event loop (the crawl itself runs on its own loop
in a thread); the corpus server runs in threads and records every request it receives.
The search-seeded behaviour (relevance first, dropping, dedupe, search failures) is in
test_crawler_search.py; tests here that are about following links crawl from the start
URL (`search_url=None`).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path

import grpc
import pytest
from crawl4ai import CrawlerRunConfig

from protos import common_pb2, retriever_pb2
from retriever_svc.corpus.web_server import CorpusServer
from retriever_svc.crawler import (
    DEFAULT_START_URL,
    AllowListFilter,
    CrawlerBackend,
    CrawlerSettings,
    CrawlThread,
    PolicyHTTPStrategy,
    build_backend,
    crawl_thread,
    document_id,
)
from retriever_svc.crawler.url_policy import GuardedResolver, UrlPolicy, UrlRefused
from retriever_svc.server_args import add_retriever_args
from tests.support.retrievers import serving_retriever
from tests.support.tiny_corpus import render

# On the tiny corpus the relevant pages are files.html (depth 1 from the index) and io/buffering.html (depth 2);
# the site search finds both directly.
QUERY = "use the with statement to close a file and flush buffered writes"
APPEND = retriever_pb2.CHUNK_MODE_APPEND


def write_pages(root: Path, pages: dict[str, tuple[str, str, list[str]]]) -> Path:
    for name, (title, body, links) in pages.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(title, body, links), encoding="utf-8")
    return root


def settings_for(corpus: CorpusServer, tmp_path: Path, **overrides) -> CrawlerSettings:
    return CrawlerSettings(start_urls=(corpus.index_url,), work_dir=tmp_path / "crawl4ai", **overrides)


async def retrieve(settings: CrawlerSettings, query: str = QUERY, **request) -> list[retriever_pb2.ContextChunk]:
    async with serving_retriever(CrawlerBackend(settings), "crawler") as served:
        stub = served.retriever
        call = stub.Retrieve(retriever_pb2.RetrieveRequest(query=query, **{"deadline_ms": 30_000, **request}))
        return [response.chunk async for response in call]


def kept_paths(chunks: list[retriever_pb2.ContextChunk]) -> list[str]:
    return [d.url.split("/", 3)[3] for c in chunks for d in c.documents]


def assert_well_formed(chunks: list[retriever_pb2.ContextChunk]) -> None:
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert all(c.mode == APPEND for c in chunks)
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    ids = [d.id for c in chunks for d in c.documents]
    assert len(ids) == len(set(ids))


def crawl_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("crawl-")]


@pytest.fixture
def corpus(tiny_corpus: Path):
    with CorpusServer(tiny_corpus) as server:
        yield server


async def test_relevant_pages_stream_as_append_chunks_then_a_final_one(corpus, tmp_path) -> None:
    chunks = await retrieve(settings_for(corpus, tmp_path, search_url=None, concurrency=1))
    assert_well_formed(chunks)
    assert kept_paths(chunks) == ["files.html", "io/buffering.html"]   # most promising link first: depth 1, then 2
    assert [len(c.documents) for c in chunks] == [1, 1, 0]              # one page per chunk, empty final
    files = chunks[0].documents[0]
    assert files.id == document_id(files.url)
    assert files.title == "Reading and Writing Files"
    assert "with statement closes the file" in files.text
    assert files.source == "crawler" and 0 < files.score < 1
    assert all(c.emitted_unix_ms > 0 for c in chunks)
    # pages with no text matching the query were fetched but not sent
    assert {r.path for r in corpus.requests} == {"/index.html", "/files.html", "/lists.html", "/dicts.html",
                                                 "/io/buffering.html"}


async def test_top_k_ends_the_stream_at_the_kth_page(corpus, tmp_path) -> None:
    chunks = await retrieve(settings_for(corpus, tmp_path), top_k=1)
    assert len(chunks) == 1 and chunks[0].final
    assert kept_paths(chunks)[0] in ("files.html", "io/buffering.html")


async def test_duplicate_urls_and_contents_are_sent_once(tiny_corpus, tmp_path) -> None:
    files = (tiny_corpus / "files.html").read_text()
    (tiny_corpus / "copy-of-files.html").write_text(files)
    write_pages(tiny_corpus, {"index.html": ("Tiny Python Guide", "A guide.",
                                             ["files.html", "files.html#modes", "copy-of-files.html",
                                              "./io/../files.html", "io/buffering.html"])})
    with CorpusServer(tiny_corpus) as corpus:
        chunks = await retrieve(settings_for(corpus, tmp_path))
    assert_well_formed(chunks)
    texts = [d.text for c in chunks for d in c.documents]
    assert len(texts) == len(set(texts)) == 2
    assert sorted(kept_paths(chunks)) in (["files.html", "io/buffering.html"],
                                          ["copy-of-files.html", "io/buffering.html"])


async def test_links_to_other_hosts_and_schemes_are_never_fetched(tiny_corpus, tmp_path) -> None:
    other_root = write_pages(tmp_path / "other", {"index.html": ("Other", QUERY, [])})
    with CorpusServer(other_root) as other, CorpusServer(tiny_corpus) as corpus:
        write_pages(tiny_corpus, {"index.html": ("Tiny Python Guide", "A guide.", [
            "files.html", other.index_url, f"http://localhost:{other.port}/index.html",
            f"http://127.0.0.2:{other.port}/index.html", "http://169.254.169.254/latest/meta-data/",
            "file:///etc/passwd", f"ftp://127.0.0.1:{other.port}/index.html", "mailto:someone@example.org"])})
        chunks = await retrieve(settings_for(corpus, tmp_path, search_url=None))   # every link is considered
        assert other.request_count == 0
    assert_well_formed(chunks)
    assert sorted(kept_paths(chunks)) == ["files.html", "io/buffering.html"]


async def test_every_request_passes_the_policy_even_outside_the_link_filter(tiny_corpus, tmp_path) -> None:
    with CorpusServer(tiny_corpus) as other, CorpusServer(tiny_corpus) as corpus:
        policy = UrlPolicy.for_start_urls([corpus.index_url])
        assert not AllowListFilter(policy).apply(other.index_url)
        strategy = PolicyHTTPStrategy(policy, max_page_bytes=64 * 1024, max_connections=2)
        async with strategy:
            with pytest.raises(UrlRefused):
                await strategy.crawl(other.index_url, CrawlerRunConfig())
            assert (await strategy.crawl(corpus.index_url, CrawlerRunConfig())).status_code == 200
        assert other.request_count == 0


@pytest.mark.parametrize("start_url, allow", [
    ("http://127.0.0.1:8765/index.html", ["example.org"]),     # not on the allow-list
    ("file:///etc/passwd", None),                               # not HTTP
    ("http://169.254.169.254/latest/meta-data/", None),         # link-local, even as its own host
    ("http://user:secret@127.0.0.1:8765/", None),               # credentials
])
def test_a_disallowed_start_url_is_a_configuration_error(start_url, allow, tmp_path) -> None:
    with pytest.raises(UrlRefused):
        CrawlerBackend(CrawlerSettings(start_urls=(start_url,), allowed_hosts=tuple(allow or ()), work_dir=tmp_path))
    args = cli_args(start_url=[start_url], allow_host=allow)
    with pytest.raises(SystemExit, match="refused"):
        build_backend(args)


async def test_a_start_url_from_the_client_is_invalid_argument(corpus, tmp_path) -> None:
    async with serving_retriever(CrawlerBackend(settings_for(corpus, tmp_path)), "crawler") as served:
        stub = served.retriever
        call = stub.Retrieve(retriever_pb2.RetrieveRequest(query=QUERY, options={"start_url": "http://evil/"}))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            [r async for r in call]
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert corpus.request_count == 0


def cli_args(*argv: str, **given) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_retriever_args(parser)
    args = parser.parse_args(["--kind", "crawler", *argv])
    for key, value in given.items():
        setattr(args, key, value)
    return args


def test_default_start_url_is_the_corpus_server_and_its_host_the_allow_list(tmp_path) -> None:
    backend = build_backend(cli_args("--max-pages", "12", "--max-depth", "1"))
    assert backend.settings.start_urls == (DEFAULT_START_URL,) == ("http://127.0.0.1:8765/index.html",)
    assert backend.policy.allows("http://127.0.0.1:8765/library/io.html")
    assert not backend.policy.allows("http://127.0.0.1:8766/library/io.html")
    facts = backend.describe().facts
    assert facts["max_pages"] == "12" and facts["search_url"] == "http://127.0.0.1:8765/search"
    assert facts["strategy"] == "best-first" and facts["seeds"] == "5"
    plain = build_backend(cli_args("--start-url", "http://docs.example.org/", "--search-url", "none"))
    assert plain.settings.resolved_search_url is None and plain.describe().facts["search_url"] == "none"


class SlowPageServer(CorpusServer):
    """The corpus server, but /slow.html answers only after 3 s."""

    def draw_delay(self, path: str) -> float:
        return 3.0 if path == "/slow.html" else 0.0


async def test_pages_that_fail_or_time_out_do_not_stop_the_crawl(tiny_corpus, tmp_path) -> None:
    write_pages(tiny_corpus, {"index.html": ("Tiny Python Guide", "A guide.",
                                             ["missing.html", "slow.html", "files.html"]),
                              "slow.html": ("Slow", QUERY, [])})
    with SlowPageServer(tiny_corpus) as corpus:
        chunks = await retrieve(settings_for(corpus, tmp_path, page_timeout_s=0.5, search_url=None))
        statuses = {r.path: r.status for r in corpus.requests}
    assert_well_formed(chunks)
    assert sorted(kept_paths(chunks)) == ["files.html", "io/buffering.html"]
    assert statuses["/missing.html"] == 404 and "/slow.html" in statuses


async def test_a_page_is_read_only_up_to_max_page_bytes(tiny_corpus, tmp_path) -> None:
    filler = "<p>" + "lorem ipsum dolor sit amet " * 40 + "</p>\n"
    (tiny_corpus / "files.html").write_text(
        "<html><head><title>Big</title></head><body><h1>Big</h1>"
        f"<p>First: {QUERY}.</p>\n{filler * 100}<p>Last: {QUERY}, beyond the cap.</p></body></html>")
    with CorpusServer(tiny_corpus) as corpus:   # 16 KiB of filler around one mention: relevance is low, keep it anyway
        chunks = await retrieve(settings_for(corpus, tmp_path, max_page_bytes=16 * 1024, min_relevance=0.0))
    big = next(d for c in chunks for d in c.documents if d.url.endswith("/files.html"))
    assert "First:" in big.text and "Last:" not in big.text


def fan_out_site(root: Path, pages: int = 40) -> Path:
    """index → p0..p9 → two children each: 31 pages within depth 2, every one relevant and distinct."""
    site: dict[str, tuple[str, str, list[str]]] = {
        "index.html": ("Index", f"Start here: {QUERY}.", [f"p{i}.html" for i in range(10)])}
    for i in range(pages):
        children = [f"p{c}.html" for c in (10 + 2 * i, 11 + 2 * i) if c < pages]
        site[f"p{i}.html"] = (f"Page {i}", f"Page {i} says: {QUERY} (note {i}).", children)
    return write_pages(root, site)


async def wait_for_crawls_to_end(timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while crawl_threads() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not crawl_threads(), "a crawl kept running after its Retrieve ended"


async def settled_request_count(corpus, quiet_s: float = 0.4, timeout_s: float = 5.0) -> int:
    """The corpus server's request count once it has not moved for `quiet_s`: on a loaded machine
    a request the crawl sent before it stopped can reach the server's handler thread late."""
    count, since = corpus.request_count, time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        if corpus.request_count != count:
            count, since = corpus.request_count, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
    return count


async def test_cancelling_retrieve_stops_the_crawl_and_its_requests(tmp_path) -> None:
    with CorpusServer(fan_out_site(tmp_path / "site"), latency="0.2") as corpus:
        settings = settings_for(corpus, tmp_path, max_pages=30, search_url=None)
        async with serving_retriever(CrawlerBackend(settings), "crawler") as served:
            stub = served.retriever
            call = stub.Retrieve(retriever_pb2.RetrieveRequest(query=QUERY, top_k=100, deadline_ms=60_000))
            first = await call.read()
            assert first.chunk.documents and not first.chunk.final
            call.cancel()
            await wait_for_crawls_to_end()
            stopped_at = await settled_request_count(corpus)
            await asyncio.sleep(0.6)                     # three latency periods: nothing more arrives
            assert corpus.request_count == stopped_at
        assert stopped_at < 15                           # a full crawl would have made 30 requests


async def test_the_deadline_ends_the_crawl_with_a_final_chunk(tmp_path) -> None:
    with CorpusServer(fan_out_site(tmp_path / "site"), latency="0.2") as corpus:
        chunks = await retrieve(settings_for(corpus, tmp_path, search_url=None), top_k=100, deadline_ms=1000)
        await wait_for_crawls_to_end()
        stopped_at = await settled_request_count(corpus)
        await asyncio.sleep(0.4)
        assert corpus.request_count == stopped_at < 30
    assert_well_formed(chunks)
    assert 1 <= len(chunks) - 1 < 30


async def test_a_crawl_that_swallows_a_cancellation_is_cancelled_again(monkeypatch, tmp_path) -> None:
    swallowed: list[bool] = []

    async def stubborn_crawl(settings, policy, query, emit) -> None:
        emit(common_pb2.Document(id="first"))
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)   # as Python 3.11's wait_for does when its future completes meanwhile

    monkeypatch.setattr(crawl_thread, "crawl_documents", stubborn_crawl)
    settings = CrawlerSettings(start_urls=("http://127.0.0.1:1/",), work_dir=tmp_path)
    crawl = CrawlThread(settings, UrlPolicy.for_start_urls(settings.start_urls), "query")
    crawl.start()
    assert (await crawl.next_document()).id == "first"
    await crawl.stop()
    assert swallowed
    await wait_for_crawls_to_end(timeout_s=1.0)


# --- the URL policy on its own -------------------------------------------------------------------

def test_policy_allows_listed_hosts_on_http_only() -> None:
    policy = UrlPolicy(["127.0.0.1:8765", "docs.example.org"])
    assert policy.allows("http://127.0.0.1:8765/index.html")
    assert policy.allows("https://docs.example.org/a.html") and policy.allows("http://DOCS.example.org:8080/")
    for url, reason in [
        ("http://127.0.0.1:8766/", "not on the allow-list"),
        ("http://127.0.0.2:8765/", "not on the allow-list"),
        ("http://example.org/", "not on the allow-list"),
        ("http://docs.example.org.evil.net/", "not on the allow-list"),
        ("file:///etc/passwd", "scheme"),
        ("ftp://docs.example.org/", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("http://user:pw@docs.example.org/", "credentials"),
        ("http://127.0.0.1:99999/", "malformed"),
        ("http:///index.html", "no host"),
    ]:
        assert reason in (policy.refusal(url) or ""), url


def test_policy_refuses_link_local_and_unspecified_addresses_even_when_listed() -> None:
    policy = UrlPolicy(["169.254.169.254", "0.0.0.0", "[fe80::1]", "[::ffff:169.254.169.254]", "10.0.0.5"])
    for url in ["http://169.254.169.254/latest/meta-data/", "http://0.0.0.0/", "http://[fe80::1]/",
                "http://[::ffff:169.254.169.254]/"]:
        assert not policy.allows(url), url
    assert policy.allows("http://10.0.0.5/")       # a private address listed explicitly is allowed


async def test_resolved_names_may_not_reach_internal_addresses_unless_trusted() -> None:
    guarded = GuardedResolver(UrlPolicy(["localhost"]))
    with pytest.raises(OSError, match="internal address"):
        await guarded.resolve("localhost", 80)
    await guarded.close()
    trusted = GuardedResolver(UrlPolicy(["localhost"], internal_names=["localhost"]))
    assert {r["host"] for r in await trusted.resolve("localhost", 80)} <= {"127.0.0.1", "::1"}
    await trusted.close()
    assert UrlPolicy(["x.org"]).address_refusal("x.org", "169.254.169.254")
    assert UrlPolicy(["x.org"], internal_names=["x.org"]).address_refusal("x.org", "169.254.169.254")
    assert UrlPolicy(["x.org"]).address_refusal("x.org", "93.184.216.34") is None


def test_start_urls_set_the_default_allow_list_and_trusted_names() -> None:
    policy = UrlPolicy.for_start_urls(["http://corpus:8765/index.html"])
    assert policy.allows("http://corpus:8765/library/") and not policy.allows("http://corpus:9999/")
    assert policy.address_refusal("corpus", "172.18.0.3") is None   # e.g. a compose service name
    with pytest.raises(UrlRefused):
        UrlPolicy.for_start_urls(["http://corpus:8765/"], allowed_hosts=["other"])
