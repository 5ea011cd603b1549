"""The crawler's configuration: one frozen dataclass of limits, with their defaults and checks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin

from retriever_svc.server_args import (
    CRAWLER_MAX_DEPTH,
    CRAWLER_MAX_PAGES,
    CRAWLER_MIN_RELEVANCE,
    CRAWLER_SEEDS,
    SEARCH_AT_START_SITE,
)

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
