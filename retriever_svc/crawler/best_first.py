"""Relevance-first crawling that streams: crawl4ai's `BestFirstCrawlingStrategy`, seeded with
several scored URLs, fetching the most promising queued URL whenever a fetch slot frees.

The queue holds (priority, depth, URL). Seeds (the site search's hits) enter at depth 0 with
the priority the caller gives them; every link found on a fetched page enters one level
deeper with the priority `LinkScorer` gives it, up to `max_depth`, unless that priority is
below `score_threshold` (the crawler sets it just above 0 when it starts from search hits:
a link that names no query term is not followed). At most `concurrency`
fetches are in flight and at most `max_pages` are started. A page is handed over the moment
its fetch ends; its links are queued at once, so the next fetch already knows them.

Why the loop is our own: the stock one takes up to 10 queued URLs, fetches them together
and yields nothing until the slowest of them has arrived. With web-like latency (lognormal,
up to 30 s per page) that holds every page of a batch behind the slowest, which is the
opposite of streaming. The rest is crawl4ai's: the strategy class, its filter chain (only
links the allow-list passes are queued), its URL-scorer interface, page cap and cancel
event, and `AsyncWebCrawler.arun` for every fetch.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import AsyncGenerator, Sequence
from urllib.parse import urlsplit

from crawl4ai import CrawlerRunConfig
from crawl4ai.deep_crawling import BestFirstCrawlingStrategy
from crawl4ai.deep_crawling.filters import FilterChain
from crawl4ai.deep_crawling.scorers import URLScorer
from crawl4ai.utils import normalize_url_for_deep_crawl

from retriever_svc.corpus.relevance import QueryScorer, url_words

LINK_WEIGHT = 0.8          # a link that names every query term ranks with a seed at 0.8 of the top hit's score
MAX_ANCHOR_CHARS = 400     # link text remembered per URL


class LinkScorer(URLScorer):
    """Priority of a queued URL: how much of the query the text of the links to it, and its
    path words, cover (IDF-weighted, 0..1), times `weight`."""

    def __init__(self, scorer: QueryScorer, weight: float = LINK_WEIGHT) -> None:
        super().__init__(weight=weight)
        self.scorer = scorer
        self.link_text: dict[str, str] = {}

    def note_link(self, url: str, text: str) -> None:
        known = self.link_text.get(url, "")
        if text and text not in known and len(known) < MAX_ANCHOR_CHARS:
            self.link_text[url] = f"{known} {text}"[:MAX_ANCHOR_CHARS]

    def _calculate_score(self, url: str) -> float:
        return self.scorer.coverage(f"{self.link_text.get(url, '')} {url_words(url)}")


class StreamingBestFirst(BestFirstCrawlingStrategy):
    """Best-first over a priority queue seeded with `seeds` ((url, priority) pairs, depth 0)."""

    def __init__(self, seeds: Sequence[tuple[str, float]], *, max_depth: int, max_pages: int, concurrency: int,
                 filter_chain: FilterChain, url_scorer: LinkScorer, score_threshold: float = float("-inf"),
                 logger: logging.Logger | None = None) -> None:
        super().__init__(max_depth=max_depth, filter_chain=filter_chain, url_scorer=url_scorer,
                         include_external=True, score_threshold=score_threshold, max_pages=max_pages, logger=logger)
        self.seeds = list(seeds)
        self.concurrency = concurrency
        self.fetched: list[str] = []              # URLs in the order their fetches started

    async def can_process_url(self, url: str, depth: int) -> bool:
        """HTTP(S) with a host; links (depth > 0) must also pass the filter chain. Unlike the
        stock check, a host without a dot (a compose service name) is fine: the allow-list decides."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False
        return depth == 0 or await self.filter_chain.apply(url)

    async def _arun_best_first(self, start_url: str, crawler, config: CrawlerRunConfig
                               ) -> AsyncGenerator:
        self._cancel_event = asyncio.Event()
        page_config = config.clone(deep_crawl_strategy=None, stream=False)
        order = itertools.count()                 # ties: first queued, first fetched
        queue: list[tuple[float, int, int, str, str | None]] = []
        best: dict[str, float] = {}               # URL -> highest priority it was queued with
        depths: dict[str, int] = {}
        visited: set[str] = set()

        def push(url: str, priority: float, depth: int, parent: str | None) -> None:
            if url in visited or priority <= best.get(url, float("-inf")):
                return
            best[url] = priority
            depths[url] = min(depth, depths.get(url, depth))
            heapq.heappush(queue, (-priority, next(order), depths[url], url, parent))

        for url, priority in self.seeds or [(start_url, 1.0)]:
            url = normalize_url_for_deep_crawl(url, url)
            if url and await self.can_process_url(url, 0):
                push(url, priority, 0, None)
        in_flight: dict[asyncio.Task, tuple[float, int, int, str, str | None]] = {}
        self._pages_crawled = 0
        try:
            while (queue or in_flight) and not await self._check_cancellation():
                while queue and len(in_flight) < self.concurrency and len(self.fetched) < self.max_pages:
                    item = heapq.heappop(queue)
                    if item[3] in visited:
                        continue
                    visited.add(item[3])
                    self.fetched.append(item[3])
                    in_flight[asyncio.ensure_future(crawler.arun(item[3], config=page_config))] = item
                if not in_flight:
                    break
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: in_flight[t][:2]):
                    priority, _, depth, url, parent = in_flight.pop(task)
                    try:
                        result = task.result()[0]
                    except Exception as exc:     # crawl4ai turns most failures into a failed result
                        self.logger.warning("fetching %s failed: %s", url, exc)
                        continue
                    result.metadata = {**(result.metadata or {}), "depth": depth, "parent_url": parent,
                                       "score": -priority}
                    if result.success:
                        self._pages_crawled += 1
                        await self._queue_links(result, url, depth, push)
                    yield result
        finally:   # closed early (top-k reached, cancelled): no fetch outlives the crawl
            for task in in_flight:
                task.cancel()
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)

    async def _queue_links(self, result, source_url: str, depth: int, push) -> None:
        if depth + 1 > self.max_depth:
            return
        links = (result.links or {}).get("internal", []) + (result.links or {}).get("external", [])
        found: dict[str, str] = {}
        for link in links:
            url = normalize_url_for_deep_crawl(link.get("href"), source_url)
            if url and url != source_url:
                found[url] = f"{found.get(url, '')} {link.get('text') or ''} {link.get('title') or ''}".strip()
        for url, text in found.items():
            if not await self.can_process_url(url, depth + 1):
                self.stats.urls_skipped += 1
                continue
            self.url_scorer.note_link(url, text)
            priority = self.url_scorer.score(url)
            if priority < self.score_threshold:
                self.stats.urls_skipped += 1
                continue
            push(url, priority, depth + 1, source_url)
