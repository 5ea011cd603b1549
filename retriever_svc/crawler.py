"""The crawler retriever: a search-seeded, relevance-first crawl that streams each relevant page
as an APPEND chunk.

1. Seeds. The crawl starts from the site's own search (`site_search`, served by the corpus
   server at `/search`): the top `seeds` hits for the query, each with its search score as
   its priority. The search also reports the IDF of each query term on the site, which then
   weights every relevance judgement below. With `search_url=None` (`--search-url none`) the
   crawl starts from the start URLs instead, for any allowed site without a search.
2. Crawl. `best_first.StreamingBestFirst` (crawl4ai's best-first strategy, streaming): the
   most promising queued URL is fetched whenever one of `concurrency` slots frees; links
   are queued by how much of the query their link text and path cover (from search hits, a
   link that names no query term is not followed; from start URLs, every allowed link is);
   depth and page caps as before (`max_depth` levels below the seeds, `max_pages` fetches).
3. Keep or drop. crawl4ai's `HTTP` strategy fetches, its markdown generator with a
   `BM25ContentFilter` keeps the parts of a page that match the query (`fit_markdown`). A
   page is dropped when its relevance to the query (`relevance.QueryScorer`, IDF-weighted
   BM25 saturation over the whole page's text, 0..1) is below `min_relevance`, when it failed, and
   when it repeats a page or, line by line, text already sent (so navigation and
   boilerplate shared by pages are sent once). Each kept page is one document; after
   `top_k` kept pages or the end of the crawl the stream ends with a final chunk.

What is fetched is bounded by `url_policy.UrlPolicy`, search-seeded URLs included: the search
URL must be allowed, each hit must pass the allow-list before it is queued, links pass a
crawl4ai filter chain (the allow-list, then HTML-looking URLs only), every request passes a
`before_request` check, names resolve through `GuardedResolver`, redirects are not followed,
and a response is read up to `max_page_bytes` and only if it is `text/html`. A search that
cannot be reached or answers garbage ends the retrieval with `RetrieverUnavailable`
(gRPC UNAVAILABLE, with what went wrong).

Each crawl runs on its own event loop in a thread, so parsing large pages never stalls the
gRPC server, and cancelling it (client gone, deadline, `top_k` reached) cancels the crawl
task there: the crawl's in-flight fetches are cancelled and no new one starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin

import aiohttp
from crawl4ai import AsyncWebCrawler, CacheMode, CrawlerRunConfig, HTTPCrawlerConfig
from crawl4ai.async_crawler_strategy import AsyncHTTPCrawlerStrategy
from crawl4ai.async_logger import AsyncLogger, LogLevel
from crawl4ai.content_filter_strategy import BM25ContentFilter
from crawl4ai.deep_crawling.filters import ContentTypeFilter, FilterChain, URLFilter
from crawl4ai.markdown_generation_strategy import DefaultMarkdownGenerator

from protos import common_pb2, retriever_pb2
from retriever_svc.best_first import LinkScorer, StreamingBestFirst
from retriever_svc.relevance import QueryScorer
from retriever_svc.server_args import (
    CRAWLER_MAX_DEPTH,
    CRAWLER_MAX_PAGES,
    CRAWLER_MIN_RELEVANCE,
    CRAWLER_SEEDS,
    SEARCH_AT_START_SITE,
)
from retriever_svc.service import RetrievalQuery, RetrieverUnavailable
from retriever_svc.url_policy import GuardedResolver, UrlPolicy, UrlRefused

log = logging.getLogger(__name__)
_strategy_log = logging.getLogger(f"{__name__}.strategy")   # crawl4ai's strategies log every page-cap hit at INFO
_strategy_log.setLevel(logging.WARNING)

CORPUS_PORT = 8765  # servicekit.config.DEFAULT_PORTS["corpus"]
DEFAULT_START_URL = f"http://127.0.0.1:{CORPUS_PORT}/index.html"
MAX_SEARCH_BYTES = 256 * 1024
MIN_DEDUP_LINE_CHARS = 20          # shorter lines (code, short headings) may repeat across pages
MIN_LINK_SCORE = 1e-6               # from search hits, follow only links whose text or URL names a query term


def default_work_dir() -> Path:
    """Where crawl4ai may keep its folder: `$STREAMRAG_CACHE_DIR/crawl4ai` or `~/.cache/streamrag/crawl4ai`."""
    base = os.environ.get("STREAMRAG_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "streamrag") / "crawl4ai"


@dataclass(frozen=True)
class CrawlerSettings:
    start_urls: tuple[str, ...] = (DEFAULT_START_URL,)
    allowed_hosts: tuple[str, ...] = ()    # empty: the start URLs' host:port
    search_url: str | None = SEARCH_AT_START_SITE   # where seeds come from; None: the start URLs are the seeds
    seeds: int = CRAWLER_SEEDS             # search hits the crawl starts from
    max_pages: int = CRAWLER_MAX_PAGES     # pages fetched per query
    max_depth: int = CRAWLER_MAX_DEPTH     # link levels below the seeds
    concurrency: int = 3                   # pages in flight at once
    max_page_bytes: int = 512 * 1024       # a longer response is cut here
    page_timeout_s: float = 10.0           # per page, and for the search
    max_doc_chars: int = 6000              # fit markdown kept per document
    min_doc_chars: int = 32                # less new relevant text than this: the page is dropped
    min_relevance: float = CRAWLER_MIN_RELEVANCE   # a page less relevant to the query than this is dropped
    bm25_threshold: float = 1.0
    stop_timeout_s: float = 2.0            # how long a cancelled crawl is waited for
    work_dir: Path = field(default_factory=default_work_dir)

    def __post_init__(self) -> None:
        if not self.start_urls:
            raise ValueError("the crawler needs at least one start URL")
        if self.max_pages < 1 or self.max_depth < 0 or self.concurrency < 1 or self.seeds < 1:
            raise ValueError("max_pages, seeds and concurrency must be at least 1, max_depth at least 0")
        if self.max_page_bytes < 1024 or self.max_doc_chars < 1:
            raise ValueError("max_page_bytes must be at least 1024 and max_doc_chars at least 1")
        if not 0 <= self.min_relevance < 1:
            raise ValueError("min_relevance must be in [0, 1)")

    @property
    def resolved_search_url(self) -> str | None:
        if self.search_url == SEARCH_AT_START_SITE:
            return urljoin(self.start_urls[0], "/search")
        return self.search_url or None


def document_id(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]


def _digest(text: str) -> str:
    return hashlib.sha256(" ".join(text.split()).lower().encode("utf-8")).hexdigest()


class PageSelector:
    """Turns crawl results into documents: drops failures, irrelevant pages and repeats (by
    URL, by content, and line by line: text an earlier kept page already sent is left out)."""

    def __init__(self, query: str, settings: CrawlerSettings, weights: dict[str, float] | None = None) -> None:
        self.scorer = QueryScorer(query, weights)
        self.settings = settings
        self.seen_urls: set[str] = set()
        self.seen_content: set[str] = set()
        self.seen_lines: set[str] = set()
        self.counts = {"fetched": 0, "failed": 0, "irrelevant": 0, "empty": 0, "duplicate": 0, "kept": 0}

    def select(self, result) -> common_pb2.Document | None:
        self.counts["fetched"] += 1
        if not result.success:
            self.counts["failed"] += 1
            log.debug("crawl of %s failed: %s", result.url, result.error_message)
            return None
        urls = {u.split("#", 1)[0] for u in (result.url, result.redirected_url) if u}
        raw = (result.markdown.raw_markdown if result.markdown else "") or ""
        text = ((result.markdown.fit_markdown if result.markdown else "") or "").strip()
        if text.startswith("Error generating fit markdown"):   # crawl4ai reports a filter failure as text
            self.counts["failed"] += 1
            return None
        relevance = self.scorer.relevance(raw)                 # the whole page's, not just the kept text's
        log.debug("%s: relevance %.3f (depth %s)", result.url, relevance, (result.metadata or {}).get("depth"))
        if relevance < self.settings.min_relevance:
            self.counts["irrelevant"] += 1
            return None
        if len(text) < self.settings.min_doc_chars:
            # crawl4ai's filter weighs terms within the page, so on a page that is about the query
            # throughout no line stands out: keep the lines that name a query term instead.
            text = "\n".join(line for line in raw.splitlines() if self.scorer.coverage(line) > 0).strip()
        if len(text) < self.settings.min_doc_chars:
            self.counts["empty"] += 1
            return None
        digest = _digest(text)
        if urls & self.seen_urls or digest in self.seen_content:
            self.counts["duplicate"] += 1
            return None
        self.seen_urls |= urls
        self.seen_content.add(digest)
        text = self._unsent_lines(text)[: self.settings.max_doc_chars].strip()
        if len(text) < self.settings.min_doc_chars:      # nothing this page says was not sent already
            self.counts["duplicate"] += 1
            return None
        self.counts["kept"] += 1
        url = result.url.split("#", 1)[0]
        title = str((result.metadata or {}).get("title") or url)
        return common_pb2.Document(id=document_id(url), title=title, url=url, text=text,
                                   score=round(relevance, 4), source="crawler")

    def _unsent_lines(self, text: str) -> str:
        """`text` without the lines (paragraphs, items, headings of `MIN_DEDUP_LINE_CHARS` or more)
        that an earlier kept page sent: navigation and boilerplate shared by pages go once."""
        kept = []
        for line in text.splitlines():
            if len(line.strip()) >= MIN_DEDUP_LINE_CHARS:
                digest = _digest(line)
                if digest in self.seen_lines:
                    continue
                self.seen_lines.add(digest)
            kept.append(line)
        return "\n".join(kept)


class AllowListFilter(URLFilter):
    """crawl4ai URL filter: only links the `UrlPolicy` allows are queued."""

    def __init__(self, policy: UrlPolicy) -> None:
        super().__init__(name="AllowListFilter")
        self.policy = policy

    def apply(self, url: str) -> bool:
        allowed = self.policy.allows(url)
        self._update_stats(allowed)
        if not allowed:
            log.debug("link refused: %s (%s)", url, self.policy.refusal(url))
        return allowed


def capped_response_class(max_bytes: int) -> type[aiohttp.ClientResponse]:
    class CappedResponse(aiohttp.ClientResponse):
        """Reads at most `max_bytes` of an HTML body; anything not `text/html` is an error."""

        async def read(self) -> bytes:
            if self.content_type != "text/html":
                raise aiohttp.ClientPayloadError(f"{self.url}: content type {self.content_type} is not HTML")
            body = bytearray()
            async for piece in self.content.iter_chunked(64 * 1024):
                body += piece[: max_bytes - len(body)]
                if len(body) >= max_bytes:
                    log.debug("%s: cut at %d bytes", self.url, max_bytes)
                    self.close()              # drop the connection instead of draining the rest
                    break
            return bytes(body)

    return CappedResponse


class PolicyHTTPStrategy(AsyncHTTPCrawlerStrategy):
    """crawl4ai's HTTP strategy with the policy enforced on every request and a byte cap per page."""

    def __init__(self, policy: UrlPolicy, max_page_bytes: int, max_connections: int) -> None:
        super().__init__(browser_config=HTTPCrawlerConfig(follow_redirects=False), max_connections=max_connections)
        self.policy = policy
        self.max_page_bytes = max_page_bytes
        self.set_hook("before_request", self._check_request)

    def _check_request(self, url: str, request_kwargs: dict) -> None:
        self.policy.check(url)

    async def start(self) -> None:
        if not self._session:
            connector = aiohttp.TCPConnector(limit=self.max_connections, resolver=GuardedResolver(self.policy))
            self._session = aiohttp.ClientSession(
                headers=dict(self._BASE_HEADERS), connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.DEFAULT_TIMEOUT),
                response_class=capped_response_class(self.max_page_bytes))


@dataclass
class Seeds:
    urls: list[tuple[str, float]]          # (URL, priority 0..1), best first
    weights: dict[str, float] | None = None   # the site's IDF per query term (None: no search)
    refused: int = 0                       # hits the allow-list refused


class SearchFailed(RetrieverUnavailable):
    """The site search could not be reached or gave an answer that is not a search result."""


def parse_search_answer(search_url: str, body: bytes, policy: UrlPolicy, limit: int) -> Seeds:
    """The seeds in a `/search` answer: hit URLs resolved against `search_url`, each passed through
    the allow-list (a refused hit is left out), priority = score / best score."""
    try:
        answer = json.loads(body)
        hits = answer["hits"]
        terms = answer.get("terms") or {}
        if not isinstance(hits, list) or not isinstance(terms, dict):
            raise TypeError("hits must be a list and terms an object")
        parsed = [(hit["url"], float(hit.get("score", 0.0))) for hit in hits]
        if not all(isinstance(url, str) for url, _ in parsed):
            raise TypeError("a hit's url must be a string")
        weights = {str(t): float(w) for t, w in terms.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise SearchFailed(f"site search {search_url} answered something that is not a search result "
                           f"({type(exc).__name__}: {exc})") from None
    if any(not math.isfinite(score) for _, score in parsed) or any(not math.isfinite(w) for w in weights.values()):
        raise SearchFailed(f"site search {search_url} answered scores that are not finite numbers")
    seeds = Seeds([], weights or None)
    allowed: dict[str, float] = {}
    for href, score in parsed:
        url = urljoin(search_url, href).split("#", 1)[0]
        if reason := policy.refusal(url):
            seeds.refused += 1
            log.warning("search hit refused: %s (%s)", url, reason)
        elif url not in allowed and len(allowed) < limit:
            allowed[url] = score
    best = max(allowed.values(), default=0.0)
    for rank, (url, score) in enumerate(allowed.items()):
        priority = score / best if best > 0 else 1.0 - rank / (len(allowed) + 1)   # no scores: by rank
        seeds.urls.append((url, max(0.0, min(1.0, priority))))
    return seeds


async def search_seeds(settings: CrawlerSettings, policy: UrlPolicy, query: str) -> Seeds:
    """Ask the site search for the query's best pages; `SearchFailed` if it cannot answer."""
    search_url = settings.resolved_search_url
    policy.check(search_url)
    connector = aiohttp.TCPConnector(limit=1, resolver=GuardedResolver(policy))
    params = {"q": query, "limit": str(settings.seeds)}
    timeout = aiohttp.ClientTimeout(total=settings.page_timeout_s)
    try:
        async with (aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                    session.get(search_url, params=params, allow_redirects=False) as response):
            status, content_type = response.status, response.content_type
            body = b""
            async for piece in response.content.iter_chunked(64 * 1024):
                body += piece
                if len(body) > MAX_SEARCH_BYTES:
                    break
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise SearchFailed(f"site search {search_url} unreachable: {exc or type(exc).__name__}") from None
    if status != 200:
        detail = body[:200].decode("utf-8", "replace")
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            detail = str(json.loads(body)["error"])
        raise SearchFailed(f"site search {search_url} answered HTTP {status}: {detail}")
    if len(body) > MAX_SEARCH_BYTES:
        raise SearchFailed(f"site search {search_url} answered more than {MAX_SEARCH_BYTES} bytes")
    if content_type != "application/json":
        raise SearchFailed(f"site search {search_url} answered {content_type or 'no content type'}, not JSON")
    return parse_search_answer(search_url, body, policy, settings.seeds)


async def crawl_documents(settings: CrawlerSettings, policy: UrlPolicy, query: str,
                          emit: Callable[[common_pb2.Document], None]) -> dict[str, int]:
    """Seed from the search (or the start URLs), crawl best-first, call `emit` with each kept page; returns counts."""
    if settings.resolved_search_url:
        seeds = await search_seeds(settings, policy, query)
    else:
        seeds = Seeds([(url, 1.0) for url in settings.start_urls])
    selector = PageSelector(query, settings, seeds.weights)
    counts = {"seeds": len(seeds.urls), "seeds_refused": seeds.refused}
    if not seeds.urls:
        return counts | selector.counts
    os.environ.setdefault("CRAWL4AI_NO_CLOUD_NOTICE", "1")
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    crawler = AsyncWebCrawler(
        crawler_strategy=PolicyHTTPStrategy(policy, settings.max_page_bytes, settings.concurrency),
        base_directory=str(settings.work_dir), logger=AsyncLogger(log_level=LogLevel.ERROR, verbose=False))
    await crawler.start()
    try:
        strategy = StreamingBestFirst(
            seeds.urls, max_depth=settings.max_depth, max_pages=settings.max_pages,
            concurrency=settings.concurrency, logger=_strategy_log, url_scorer=LinkScorer(selector.scorer),
            score_threshold=MIN_LINK_SCORE if settings.resolved_search_url else float("-inf"),
            filter_chain=FilterChain([AllowListFilter(policy), ContentTypeFilter(["text/html"])]))
        run = CrawlerRunConfig(
            deep_crawl_strategy=strategy,
            markdown_generator=DefaultMarkdownGenerator(
                content_filter=BM25ContentFilter(user_query=query, bm25_threshold=settings.bm25_threshold),
                options={"ignore_links": True, "ignore_images": True}),   # link text stays, URLs go
            stream=True, cache_mode=CacheMode.BYPASS, page_timeout=int(settings.page_timeout_s * 1000),
            semaphore_count=settings.concurrency, mean_delay=0.0, max_range=0.0, verbose=False)
        async for result in await crawler.arun(seeds.urls[0][0], config=run):
            if (document := selector.select(result)) is not None:
                emit(document)
    finally:
        await crawler.close()
    return counts | selector.counts


_END = object()


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable, *args: object) -> None:
    """Schedule `callback` on another thread's loop; a loop that has closed is ignored."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


class CrawlThread:
    """One crawl on its own event loop in a daemon thread; documents arrive on the caller's loop.

    A crawl that fails with `RetrieverUnavailable` (the search could not answer) hands the
    error to the caller: `next_document` raises it."""

    def __init__(self, settings: CrawlerSettings, policy: UrlPolicy, query: str) -> None:
        self.settings, self.policy, self.query = settings, policy, query
        self._caller = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._finished = self._caller.create_future()
        self._lock = threading.Lock()
        self._cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread = threading.Thread(target=self._run, name=f"crawl-{id(self):x}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def next_document(self) -> common_pb2.Document | None:
        """The next kept page, or None when the crawl has ended."""
        item = await self._queue.get()
        if isinstance(item, RetrieverUnavailable):
            raise item
        return None if item is _END else item

    async def stop(self) -> None:
        """Cancel the crawl (if still running) and wait, up to `stop_timeout_s`, for its thread to end."""
        with self._lock:
            self._cancelled = True
            if self._loop is not None:
                _call_soon(self._loop, self._cancel_crawl)
        try:
            await asyncio.wait_for(asyncio.shield(self._finished), self.settings.stop_timeout_s)
        except TimeoutError:
            log.warning("crawl for %r still stopping after %.1f s", self.query, self.settings.stop_timeout_s)

    def _cancel_crawl(self) -> None:
        """On the crawl's loop: cancel its task, again every 50 ms until it ends.

        Python 3.11's `asyncio.wait_for` drops a cancellation that lands as its inner future
        completes, and crawl4ai calls it in loops while fetching.
        """
        if self._task is not None and not self._task.done():
            self._task.cancel()
            asyncio.get_running_loop().call_later(0.05, self._cancel_crawl)

    def _post(self, item: object) -> None:
        _call_soon(self._caller, self._queue.put_nowait, item)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except asyncio.CancelledError:
            pass
        except RetrieverUnavailable as exc:
            log.warning("crawl for %r: %s", self.query, exc)
            self._post(exc)
        except Exception:
            log.exception("crawl for %r failed", self.query)
        finally:
            self._post(_END)
            _call_soon(self._caller, self._mark_finished)

    def _mark_finished(self) -> None:
        if not self._finished.done():
            self._finished.set_result(None)

    async def _main(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        counts = await crawl_documents(self.settings, self.policy, self.query, self._post)
        log.info("crawl for %r: %s", self.query, counts)


class CrawlerBackend:
    """`RetrieverBackend` for `--kind crawler`: one APPEND chunk per kept page, then a final chunk."""

    kind = retriever_pb2.RETRIEVER_KIND_CRAWLER
    has_collections = False
    options: frozenset[str] = frozenset()   # start URLs, search and limits are server configuration

    def __init__(self, settings: CrawlerSettings) -> None:
        self.settings = settings
        self.policy = UrlPolicy.for_start_urls(settings.start_urls, settings.allowed_hosts)
        search_url = settings.resolved_search_url
        if search_url and (reason := self.policy.refusal(search_url)):
            raise UrlRefused(f"search URL {search_url!r} refused: {reason}")

    async def retrieve(self, query: RetrievalQuery) -> AsyncIterator[retriever_pb2.ContextChunk]:
        crawl = CrawlThread(self.settings, self.policy, query.query)
        crawl.start()
        try:
            kept = 0
            while (document := await crawl.next_document()) is not None:
                kept += 1
                last = kept >= query.top_k
                yield retriever_pb2.ContextChunk(mode=retriever_pb2.CHUNK_MODE_APPEND, documents=[document], final=last)
                if last:
                    return
            yield retriever_pb2.ContextChunk(mode=retriever_pb2.CHUNK_MODE_APPEND, final=True)
        finally:
            await crawl.stop()

    def describe(self) -> retriever_pb2.RetrieverInfo:
        s = self.settings
        return retriever_pb2.RetrieverInfo(kind=self.kind, corpus="web", facts={
            "start_urls": " ".join(s.start_urls), "allowed_hosts": " ".join(f"{r.host}:{r.port or '*'}"
                                                                            for r in self.policy.rules),
            "search_url": s.resolved_search_url or "none", "seeds": str(s.seeds), "strategy": "best-first",
            "max_pages": str(s.max_pages), "max_depth": str(s.max_depth), "concurrency": str(s.concurrency),
            "max_page_bytes": str(s.max_page_bytes), "max_doc_chars": str(s.max_doc_chars),
            "min_relevance": str(s.min_relevance), "content_filter": f"bm25(threshold={s.bm25_threshold})"})


def build_backend(args: argparse.Namespace) -> CrawlerBackend:
    """The crawler backend from `streamrag serve retriever --kind crawler` flags."""
    try:
        settings = CrawlerSettings(start_urls=tuple(args.start_url or (DEFAULT_START_URL,)),
                                   allowed_hosts=tuple(args.allow_host or ()),
                                   search_url=None if args.search_url == "none" else args.search_url,
                                   seeds=args.seeds, min_relevance=args.min_relevance,
                                   max_pages=args.max_pages, max_depth=args.max_depth)
        return CrawlerBackend(settings)
    except (UrlRefused, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
