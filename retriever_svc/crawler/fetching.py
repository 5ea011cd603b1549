"""How a crawl fetches: crawl4ai's HTTP strategy and link filter, bound by the `UrlPolicy`.

Links are queued only when the allow-list passes them (`AllowListFilter`); every request passes
a `before_request` check, names resolve through `GuardedResolver`, redirects are not followed,
and a response is read up to `max_page_bytes` and only if it is `text/html`.
"""

from __future__ import annotations

import logging

import aiohttp
from crawl4ai import HTTPCrawlerConfig
from crawl4ai.async_crawler_strategy import AsyncHTTPCrawlerStrategy
from crawl4ai.deep_crawling.filters import URLFilter

from retriever_svc.crawler.url_policy import GuardedResolver, UrlPolicy

log = logging.getLogger(__name__)


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
