"""Keep or drop each fetched page: a kept page becomes one document of the retrieval.

A page is dropped when its fetch failed, when its relevance to the query (`corpus.relevance.QueryScorer`,
IDF-weighted BM25 saturation over the whole page's text, 0..1) is below `min_relevance`, when
too little query-related text is left (`min_doc_chars`), and when it repeats what the crawl
already sent (`already_sent`). The document's text is crawl4ai's `fit_markdown` (the parts a
`BM25ContentFilter` kept), cut at `max_doc_chars`; its score is the page's relevance.
"""

from __future__ import annotations

import hashlib
import logging

from protos import common_pb2
from retriever_svc.corpus.relevance import QueryScorer
from retriever_svc.crawler.already_sent import AlreadySent
from retriever_svc.crawler.settings import CrawlerSettings

log = logging.getLogger(__name__)


def document_id(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]


class PageSelector:
    """Turns crawl results into documents: drops failures, irrelevant pages and repeats (by
    URL, by content, and line by line: text an earlier kept page already sent is left out)."""

    def __init__(self, query: str, settings: CrawlerSettings, weights: dict[str, float] | None = None) -> None:
        self.scorer = QueryScorer(query, weights)
        self.settings = settings
        self.sent = AlreadySent()
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
        if self.sent.repeats(urls, text):
            self.counts["duplicate"] += 1
            return None
        self.sent.add(urls, text)
        text = self.sent.unsent_lines(text)[: self.settings.max_doc_chars].strip()
        if len(text) < self.settings.min_doc_chars:      # nothing this page says was not sent already
            self.counts["duplicate"] += 1
            return None
        self.counts["kept"] += 1
        url = result.url.split("#", 1)[0]
        title = str((result.metadata or {}).get("title") or url)
        return common_pb2.Document(id=document_id(url), title=title, url=url, text=text,
                                   score=round(relevance, 4), source="crawler")
