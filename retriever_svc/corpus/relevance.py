"""Query terms and lexical relevance: the one tokenizer the site search and the crawler share.

`terms(text)` lower-cases, keeps words of letters, digits and underscores (so `lru_cache`
and `__init__` stay whole), drops English stop words and the filler of questions ("how do
I ..."), and stems with Snowball (English). The site search indexes pages with it; the
crawler scores pages and links with `QueryScorer`, which weights each query term by the
site's inverse document frequency when the search reported it (unit weights otherwise).

Only the standard library and `snowballstemmer` (pure Python, imported on first use) are
needed, so the corpus web server can use this module too.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping

STOP_WORDS = frozenset("""
    a about above after again against all also am an and any are as at be because been before being
    below between both but by can could did do does doing done down during each either else even ever
    every few for from further get gets got had has have having he her here hers him his how i if in
    into is it its itself just let like make may me might more most much must my myself need no nor not
    now of off on once one only or other our ours out over own per please same shall she should so some
    such than that the their theirs them then there these they this those through thus to too under
    until up upon us use used uses using via want was way ways we well were what whatever when where
    whether which while who whom whose why will with within without would yes yet you your yours
""".split())  # noqa: SIM905 (a word list reads better as text)
_WORD = re.compile(r"[a-z0-9_]+")
_local = threading.local()          # a Snowball stemmer is not thread-safe: one per thread
_stems: dict[str, str] = {}         # word -> stem, shared (dict reads and writes are atomic)
_MAX_CACHED_STEMS = 500_000


def _stem(word: str) -> str:
    stem = _stems.get(word)
    if stem is None:
        stemmer = getattr(_local, "stemmer", None)
        if stemmer is None:
            from snowballstemmer import stemmer as snowball

            stemmer = _local.stemmer = snowball("english").stemWord
        stem = stemmer(word)
        if len(_stems) < _MAX_CACHED_STEMS:
            _stems[word] = stem
    return stem


def terms(text: str) -> list[str]:
    """The stemmed content words of `text`, in order (stop words and single characters dropped)."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in STOP_WORDS]


def url_words(url: str) -> str:
    """The words of a URL's path (`library/json.html` -> "library json"), to score a link by."""
    path = url.split("://", 1)[-1].partition("/")[2].split("?", 1)[0].split("#", 1)[0]
    return " ".join(w for w in re.split(r"[/._\-]+", path) if w and w not in ("html", "htm", "index"))


class QueryScorer:
    """How well a text matches a query: BM25 term saturation, each term weighted by its IDF.

    `score(text)` is the weighted BM25 sum (grows with matches, no upper bound);
    `relevance(text)` is that sum divided by its supremum, so it lies in [0, 1) whatever the
    query: 0 when no query term occurs, near 1 when every term occurs often.
    """

    K1, B, AVG_TOKENS = 1.2, 0.75, 300

    def __init__(self, query: str, weights: Mapping[str, float] | None = None) -> None:
        self.terms = tuple(dict.fromkeys(terms(query)))
        if weights:    # the site's IDF per term; a term the site never uses cannot help a page
            self.weights = {t: max(0.0, float(weights.get(t, 0.0))) for t in self.terms}
        else:
            self.weights = dict.fromkeys(self.terms, 1.0)
        self._total = sum(self.weights.values())

    def _saturation(self, tokens: Iterable[str], length: int | None = None) -> dict[str, float]:
        tokens = list(tokens)
        counts = Counter(t for t in tokens if t in self.weights)
        size = len(tokens) if length is None else length
        norm = self.K1 * (1 - self.B + self.B * size / self.AVG_TOKENS)
        return {t: tf * (self.K1 + 1) / (tf + norm) for t, tf in counts.items()}

    def score(self, text: str) -> float:
        return round(sum(self.weights[t] * s for t, s in self._saturation(terms(text)).items()), 4)

    def relevance(self, text: str) -> float:
        if not self._total:
            return 0.0
        saturation = self._saturation(terms(text))
        return sum(self.weights[t] * s for t, s in saturation.items()) / (self._total * (self.K1 + 1))

    def coverage(self, text: str) -> float:
        """The IDF-weighted share of the query's terms that occur in `text` (0..1), ignoring counts."""
        if not self._total:
            return 0.0
        present = set(terms(text))
        return sum(w for t, w in self.weights.items() if t in present) / self._total
