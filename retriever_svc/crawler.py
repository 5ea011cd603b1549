"""The crawler retriever: a breadth-first crawl that streams each relevant page as an APPEND chunk.

Built on crawl4ai without a browser: `AsyncHTTPCrawlerStrategy`, `BFSDeepCrawlStrategy`
(depth and page cap, `stream=True`) and a markdown generator whose `BM25ContentFilter`
keeps only the parts of a page that match the query (`result.markdown.fit_markdown`).
Each kept page becomes one document; pages with no relevant text, a URL or content seen
before, or a failed fetch are skipped and the crawl goes on. After `top_k` kept pages or
the end of the crawl the stream ends with a final chunk.

What is fetched is bounded by `url_policy.UrlPolicy`: links pass a crawl4ai filter chain
(the allow-list, then HTML-looking URLs only), every request passes a `before_request`
check, names resolve through `GuardedResolver`, redirects are not followed, and a response
is read up to `max_page_bytes` and only if it is `text/html`.

Each crawl runs on its own event loop in a thread, so parsing large pages never stalls the
gRPC server, and cancelling it (client gone, deadline, `top_k` reached) cancels the crawl
task there: crawl4ai's dispatcher cancels its in-flight fetches and no new one starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from crawl4ai import AsyncWebCrawler, CacheMode, CrawlerRunConfig, HTTPCrawlerConfig
from crawl4ai.async_crawler_strategy import AsyncHTTPCrawlerStrategy
from crawl4ai.async_logger import AsyncLogger, LogLevel
from crawl4ai.content_filter_strategy import BM25ContentFilter
from crawl4ai.deep_crawling import BFSDeepCrawlStrategy
from crawl4ai.deep_crawling.filters import ContentTypeFilter, FilterChain, URLFilter
from crawl4ai.markdown_generation_strategy import DefaultMarkdownGenerator
from crawl4ai.utils import clean_tokens
from snowballstemmer import stemmer

from protos import common_pb2, retriever_pb2
from retriever_svc.service import RetrievalQuery
from retriever_svc.url_policy import GuardedResolver, UrlPolicy, UrlRefused

log = logging.getLogger(__name__)
_bfs_log = logging.getLogger(f"{__name__}.bfs")    # crawl4ai's BFS logs every page-cap hit at INFO
_bfs_log.setLevel(logging.WARNING)

CORPUS_PORT = 8765  # servicekit.config.DEFAULT_PORTS["corpus"]
DEFAULT_START_URL = f"http://127.0.0.1:{CORPUS_PORT}/index.html"


def default_work_dir() -> Path:
    """Where crawl4ai may keep its folder: `$STREAMRAG_CACHE_DIR/crawl4ai` or `~/.cache/streamrag/crawl4ai`."""
    base = os.environ.get("STREAMRAG_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "streamrag") / "crawl4ai"


@dataclass(frozen=True)
class CrawlerSettings:
    start_urls: tuple[str, ...] = (DEFAULT_START_URL,)
    allowed_hosts: tuple[str, ...] = ()    # empty: the start URLs' host:port
    max_pages: int = 30                    # pages fetched per query, over all start URLs
    max_depth: int = 2
    concurrency: int = 3                   # pages in flight at once
    max_page_bytes: int = 512 * 1024       # a longer response is cut here
    page_timeout_s: float = 10.0
    max_doc_chars: int = 6000              # fit markdown kept per document
    min_doc_chars: int = 32                # less relevant text than this: the page is dropped
    bm25_threshold: float = 1.0
    stop_timeout_s: float = 2.0            # how long a cancelled crawl is waited for
    work_dir: Path = field(default_factory=default_work_dir)

    def __post_init__(self) -> None:
        if not self.start_urls:
            raise ValueError("the crawler needs at least one start URL")
        if self.max_pages < 1 or self.max_depth < 0 or self.concurrency < 1:
            raise ValueError("max_pages and concurrency must be at least 1, max_depth at least 0")
        if self.max_page_bytes < 1024 or self.max_doc_chars < 1:
            raise ValueError("max_page_bytes must be at least 1024 and max_doc_chars at least 1")


def document_id(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]


class QueryScorer:
    """BM25 term saturation with unit IDF over crawl4ai's stemmed, stop-word-free query terms."""

    K1, B, AVG_TOKENS = 1.2, 0.75, 300

    def __init__(self, query: str) -> None:
        self._stem = stemmer("english").stemWord
        self.terms = set(clean_tokens([self._stem(w) for w in self._words(query)]))

    @staticmethod
    def _words(text: str) -> list[str]:
        return re.findall(r"[a-z0-9_]+", text.lower())

    def score(self, text: str) -> float:
        tokens = [self._stem(w) for w in self._words(text)]
        norm = self.K1 * (1 - self.B + self.B * len(tokens) / self.AVG_TOKENS)
        counts = {t: 0 for t in self.terms}
        for token in tokens:
            if token in counts:
                counts[token] += 1
        return round(sum(tf * (self.K1 + 1) / (tf + norm) for tf in counts.values() if tf), 4)


class PageSelector:
    """Turns crawl results into documents: drops failures, empty pages and repeats (URL or content)."""

    def __init__(self, query: str, settings: CrawlerSettings) -> None:
        self.scorer = QueryScorer(query)
        self.settings = settings
        self.seen_urls: set[str] = set()
        self.seen_content: set[str] = set()
        self.counts = {"fetched": 0, "failed": 0, "empty": 0, "duplicate": 0, "kept": 0}

    def select(self, result) -> common_pb2.Document | None:
        self.counts["fetched"] += 1
        if not result.success:
            self.counts["failed"] += 1
            log.debug("crawl of %s failed: %s", result.url, result.error_message)
            return None
        urls = {u.split("#", 1)[0] for u in (result.url, result.redirected_url) if u}
        text = (result.markdown.fit_markdown if result.markdown else "") or ""
        text = text.strip()[: self.settings.max_doc_chars].strip()
        if text.startswith("Error generating fit markdown"):   # crawl4ai reports a filter failure as text
            self.counts["failed"] += 1
            return None
        if len(text) < self.settings.min_doc_chars:
            self.counts["empty"] += 1
            return None
        digest = hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()
        if urls & self.seen_urls or digest in self.seen_content:
            self.counts["duplicate"] += 1
            return None
        self.seen_urls |= urls
        self.seen_content.add(digest)
        self.counts["kept"] += 1
        url = result.url.split("#", 1)[0]
        title = str((result.metadata or {}).get("title") or url)
        return common_pb2.Document(id=document_id(url), title=title, url=url, text=text,
                                   score=self.scorer.score(text), source="crawler")


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


async def crawl_documents(settings: CrawlerSettings, policy: UrlPolicy, query: str,
                          emit: Callable[[common_pb2.Document], None]) -> dict[str, int]:
    """Crawl breadth-first from each start URL, calling `emit` with each kept page; returns counts."""
    os.environ.setdefault("CRAWL4AI_NO_CLOUD_NOTICE", "1")
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    selector = PageSelector(query, settings)
    crawler = AsyncWebCrawler(
        crawler_strategy=PolicyHTTPStrategy(policy, settings.max_page_bytes, settings.concurrency),
        base_directory=str(settings.work_dir), logger=AsyncLogger(log_level=LogLevel.ERROR, verbose=False))
    await crawler.start()
    try:
        for start_url in settings.start_urls:
            budget = settings.max_pages - selector.counts["fetched"]
            if budget <= 0:
                break
            run = CrawlerRunConfig(
                deep_crawl_strategy=BFSDeepCrawlStrategy(
                    max_depth=settings.max_depth, max_pages=budget, logger=_bfs_log,
                    filter_chain=FilterChain([AllowListFilter(policy), ContentTypeFilter(["text/html"])])),
                markdown_generator=DefaultMarkdownGenerator(
                    content_filter=BM25ContentFilter(user_query=query, bm25_threshold=settings.bm25_threshold),
                    options={"ignore_links": True, "ignore_images": True}),   # link text stays, URLs go
                stream=True, cache_mode=CacheMode.BYPASS, page_timeout=int(settings.page_timeout_s * 1000),
                semaphore_count=settings.concurrency, mean_delay=0.0, max_range=0.0, verbose=False)
            async for result in await crawler.arun(start_url, config=run):
                if (document := selector.select(result)) is not None:
                    emit(document)
    finally:
        await crawler.close()
    return selector.counts


_END = object()


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable, *args: object) -> None:
    """Schedule `callback` on another thread's loop; a loop that has closed is ignored."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


class CrawlThread:
    """One crawl on its own event loop in a daemon thread; documents arrive on the caller's loop."""

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
        completes, and crawl4ai's dispatcher calls it in a loop while URLs are queued.
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
    options: frozenset[str] = frozenset()   # start URLs and limits are server configuration

    def __init__(self, settings: CrawlerSettings) -> None:
        self.settings = settings
        self.policy = UrlPolicy.for_start_urls(settings.start_urls, settings.allowed_hosts)

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
            "max_pages": str(s.max_pages), "max_depth": str(s.max_depth), "concurrency": str(s.concurrency),
            "max_page_bytes": str(s.max_page_bytes), "max_doc_chars": str(s.max_doc_chars),
            "content_filter": f"bm25(threshold={s.bm25_threshold})"})


def build_backend(args: argparse.Namespace) -> CrawlerBackend:
    """The crawler backend from `streamrag serve retriever --kind crawler` flags."""
    try:
        settings = CrawlerSettings(start_urls=tuple(args.start_url or (DEFAULT_START_URL,)),
                                   allowed_hosts=tuple(args.allow_host or ()),
                                   max_pages=args.max_pages, max_depth=args.max_depth)
        return CrawlerBackend(settings)
    except (UrlRefused, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
