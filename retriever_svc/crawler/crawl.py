"""One crawl: seeds, then crawl4ai's best-first deep crawl, streaming each kept page.

`best_first.StreamingBestFirst` fetches the most promising queued URL whenever one of
`concurrency` slots frees; links are queued by how much of the query their link text and path
cover (from search hits, a link that names no query term is not followed; from start URLs,
every allowed link is; a link passes the allow-list, then looks like HTML), at most
`max_depth` levels below the seeds and `max_pages` fetches.
crawl4ai's markdown generator with a `BM25ContentFilter` keeps the parts of each page that
match the query (`fit_markdown`); `pages.PageSelector` keeps or drops the page.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from crawl4ai import AsyncWebCrawler, CacheMode, CrawlerRunConfig
from crawl4ai.async_logger import AsyncLogger, LogLevel
from crawl4ai.content_filter_strategy import BM25ContentFilter
from crawl4ai.deep_crawling.filters import ContentTypeFilter, FilterChain
from crawl4ai.markdown_generation_strategy import DefaultMarkdownGenerator

from protos import common_pb2
from retriever_svc.crawler.best_first import LinkScorer, StreamingBestFirst
from retriever_svc.crawler.fetching import AllowListFilter, PolicyHTTPStrategy
from retriever_svc.crawler.pages import PageSelector
from retriever_svc.crawler.seeds import Seeds, search_seeds
from retriever_svc.crawler.settings import CrawlerSettings
from retriever_svc.crawler.url_policy import UrlPolicy

# crawl4ai's strategies log every page-cap hit at INFO
_strategy_log = logging.getLogger("retriever_svc.crawler.strategy")
_strategy_log.setLevel(logging.WARNING)

MIN_LINK_SCORE = 1e-6               # from search hits, follow only links whose text or URL names a query term


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
