"""The corpus site's own search: BM25 over its pages, served as `GET /search?q=...&limit=N`.

What a site search (or a search engine restricted to the site) gives a crawler: the pages
most likely to answer a question, to start crawling from. Every page of the site root
(`corpus.extract.html_files`: generated indexes and `_*` folders left out) is one document:
its text, plus its title and URL words counted `TITLE_WEIGHT` times and its headings
`HEADING_WEIGHT` times, tokenized by `relevance.terms`. Ranking is Okapi BM25.

The answer is JSON:

    {"query": "...", "pages": 497,
     "terms": {"gzip": 4.52, "compress": 3.1},        # IDF of each query term the site uses
     "hits": [{"url": "library/gzip.html", "title": "gzip — Support for gzip files",
               "score": 17.2}, ...]}

Hit URLs are relative to the site root, so they stay right behind any host name. A bad
request (no query, a query over `MAX_QUERY_CHARS`, a limit outside 1..`MAX_LIMIT`) is a
`SearchRequestError` (HTTP 400 with `{"error": ...}`).

Standard library only (plus `snowballstemmer` through `relevance`), like the corpus server.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from retriever_svc.corpus.extract import Page, extract_html, html_files
from retriever_svc.corpus.relevance import terms

MAX_QUERY_CHARS = 2000          # the Retriever service's own limit (retriever_svc.service)
MAX_LIMIT = 50
DEFAULT_LIMIT = 10
TITLE_WEIGHT = 3                # a title (or URL) word counts as this many body words
HEADING_WEIGHT = 2


class SearchRequestError(ValueError):
    """A search request that cannot be answered as asked (HTTP 400)."""


@dataclass(frozen=True)
class SearchHit:
    url: str                    # relative to the site root, e.g. "library/json.html"
    title: str
    score: float


@dataclass(frozen=True)
class SearchResult:
    query: str
    hits: list[SearchHit]
    idf: dict[str, float]       # the query's terms that occur on the site -> their IDF
    pages: int

    def to_json(self) -> bytes:
        return json.dumps({"query": self.query, "pages": self.pages,
                           "terms": {t: round(w, 4) for t, w in self.idf.items()},
                           "hits": [{"url": h.url, "title": h.title, "score": round(h.score, 4)} for h in self.hits]},
                          ensure_ascii=False).encode("utf-8")


def parse_search_request(query_string: str) -> tuple[str, int]:
    """(query, limit) from a URL's query string; SearchRequestError when they are missing or out of range."""
    try:
        params = parse_qs(query_string, keep_blank_values=True, strict_parsing=False, max_num_fields=8)
    except ValueError as exc:
        raise SearchRequestError(f"bad query string: {exc}") from None
    query = " ".join(params.get("q", [""])[0].split())
    if not query:
        raise SearchRequestError("give the search terms as ?q=...")
    if len(query) > MAX_QUERY_CHARS:
        raise SearchRequestError(f"the query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
    raw_limit = params.get("limit", [str(DEFAULT_LIMIT)])[0]
    try:
        limit = int(raw_limit)
    except ValueError:
        raise SearchRequestError(f"limit must be an integer, got {raw_limit!r}") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise SearchRequestError(f"limit must be in [1, {MAX_LIMIT}], got {limit}")
    return query, limit


class SiteSearch:
    """An in-memory BM25 index of a site's pages. Immutable once built; safe to share between threads."""

    K1, B = 1.2, 0.75

    def __init__(self, pages: Iterable[Page]) -> None:
        self.urls: list[str] = []
        self.titles: list[str] = []
        self.lengths: list[int] = []
        self.postings: dict[str, list[tuple[int, int]]] = {}    # term -> [(page, weighted term count)]
        for page in pages:
            counts = Counter(terms(" ".join(s.text for s in page.sections)))
            for term in terms(f"{page.title} {page.url.removesuffix('.html').replace('/', ' ')}"):
                counts[term] += TITLE_WEIGHT
            for term in terms(" ".join(s.heading for s in page.sections)):
                counts[term] += HEADING_WEIGHT
            number = len(self.urls)
            self.urls.append(page.url)
            self.titles.append(page.title)
            self.lengths.append(sum(counts.values()))
            for term, count in counts.items():
                self.postings.setdefault(term, []).append((number, count))
        self.average_length = sum(self.lengths) / len(self.lengths) if self.lengths else 1.0

    @classmethod
    def build(cls, root: Path) -> SiteSearch:
        """Index every page under `root` (the same pages the passage index uses)."""
        def pages() -> Iterable[Page]:
            for path in html_files(root):
                html = path.read_text(encoding="utf-8", errors="replace")
                yield extract_html(html, path.relative_to(root).as_posix())
        return cls(pages())

    @property
    def page_count(self) -> int:
        return len(self.urls)

    def idf(self, term: str) -> float:
        df = len(self.postings.get(term, ()))
        return math.log(1 + (self.page_count - df + 0.5) / (df + 0.5)) if df else 0.0

    def search(self, query: str, limit: int = DEFAULT_LIMIT) -> SearchResult:
        idf = {t: self.idf(t) for t in dict.fromkeys(terms(query))}
        idf = {t: w for t, w in idf.items() if w > 0}
        scores: dict[int, float] = {}
        for term, weight in idf.items():
            for page, count in self.postings[term]:
                norm = self.K1 * (1 - self.B + self.B * self.lengths[page] / self.average_length)
                scores[page] = scores.get(page, 0.0) + weight * count * (self.K1 + 1) / (count + norm)
        best = sorted(scores.items(), key=lambda item: (-item[1], self.urls[item[0]]))[:limit]
        hits = [SearchHit(self.urls[p], self.titles[p], s) for p, s in best]
        return SearchResult(query, hits, idf, self.page_count)
