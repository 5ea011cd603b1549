"""Where a crawl starts: the top hits of the site's own search for the query (`site_search`,
served by the corpus server at `/search`), each with its search score as its priority.

The search also reports the IDF of each query term on the site, which then weights every
relevance judgement of the crawl. The search URL must be allowed, and each hit must pass the
allow-list before it is queued. A search that cannot be reached or answers garbage is a
`SearchFailed` (a `RetrieverUnavailable`: gRPC UNAVAILABLE, with what went wrong).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from dataclasses import dataclass
from urllib.parse import urljoin

import aiohttp

from retriever_svc.crawler.settings import CrawlerSettings
from retriever_svc.crawler.url_policy import GuardedResolver, UrlPolicy
from retriever_svc.service import RetrieverUnavailable

log = logging.getLogger(__name__)

MAX_SEARCH_BYTES = 256 * 1024


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
