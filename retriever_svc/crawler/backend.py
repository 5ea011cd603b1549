"""The crawler as a `RetrieverBackend`: one APPEND chunk per kept page, then a final chunk, and
`build_backend` from the `streamrag serve retriever --kind crawler` flags."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

from protos import retriever_pb2
from retriever_svc.crawler.crawl_thread import CrawlThread
from retriever_svc.crawler.settings import DEFAULT_START_URL, CrawlerSettings
from retriever_svc.crawler.url_policy import UrlPolicy, UrlRefused
from retriever_svc.service import RetrievalQuery


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

    def close(self) -> None:
        """Nothing runs in the background: each crawl belongs to its call and stops with it."""


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
