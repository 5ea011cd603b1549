"""The crawler retriever: a search-seeded, relevance-first crawl that streams each relevant page
as an APPEND chunk.

1. Seeds (`seeds`). The crawl starts from the site's own search: the top `seeds` hits for the
   query, each with its search score as its priority; the search's IDF per query term then
   weights every relevance judgement below. With `search_url=None` (`--search-url none`) the
   crawl starts from the start URLs instead, for any allowed site without a search.
2. Crawl (`crawl`). Best-first and streaming (`best_first.StreamingBestFirst`): the most
   promising queued URL is fetched whenever a slot frees, within depth and page caps.
3. Keep or drop (`pages`, `already_sent`). A page is dropped when it failed, when it is not
   relevant enough to the query, and when it repeats a page or, line by line, text already
   sent. Each kept page is one document; after `top_k` kept pages or the end of the crawl the
   stream ends with a final chunk (`backend`).

What is fetched is bounded by `url_policy.UrlPolicy`, search-seeded URLs included (`fetching`:
the allow-list on links and on every request, guarded name resolution, no redirects, a byte cap
and HTML only). Each crawl runs on its own event loop in a thread (`crawl_thread`), so parsing
large pages never stalls the gRPC server. `settings` holds the limits.

`retriever_svc.server` loads this package by name for `--kind crawler` (`build_backend`).
"""

from retriever_svc.crawler.backend import CrawlerBackend, build_backend
from retriever_svc.crawler.crawl import crawl_documents
from retriever_svc.crawler.crawl_thread import CrawlThread
from retriever_svc.crawler.fetching import AllowListFilter, PolicyHTTPStrategy
from retriever_svc.crawler.pages import PageSelector, document_id
from retriever_svc.crawler.seeds import SearchFailed, Seeds, parse_search_answer, search_seeds
from retriever_svc.crawler.settings import DEFAULT_START_URL, CrawlerSettings

__all__ = ["DEFAULT_START_URL", "AllowListFilter", "CrawlThread", "CrawlerBackend", "CrawlerSettings", "PageSelector",
           "PolicyHTTPStrategy", "SearchFailed", "Seeds", "build_backend", "crawl_documents", "document_id",
           "parse_search_answer", "search_seeds"]
