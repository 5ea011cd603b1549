"""Drafts from the request's own tokens (prompt lookup): `NgramProposer` finds the longest suffix of
the request's tokens (prompt + output) that occurred earlier, trying n-gram sizes from largest to
smallest, and drafts the up to k tokens that followed its most recent earlier occurrence. No draft
model: RAG answers quote their context, so the next tokens of an answer often already appear in the
prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_NGRAM_SIZES = (4, 3, 2)   # longest first; a 1-gram match drafts too eagerly on this vocabulary


class NgramProposer:
    """Drafts from the most recent earlier occurrence of the longest matching suffix n-gram.

    The index grows with the tokens (`extend`); a request's tokens only grow once it decodes
    (rejected drafts never enter them), so the index is built once and extended per step.
    """

    def __init__(self, ngram_sizes: Sequence[int] = DEFAULT_NGRAM_SIZES) -> None:
        if not ngram_sizes or any(n < 1 for n in ngram_sizes):
            raise ValueError("n-gram sizes must be >= 1")
        self.ngram_sizes = tuple(sorted(set(ngram_sizes), reverse=True))
        self.tokens: list[int] = []
        # per size: n-gram -> position just after its latest occurrence that has a follower
        self._follower: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ngram_sizes}

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            end = len(self.tokens)      # the n-grams ending here now have a follower: `token`
            for n, index in self._follower.items():
                if end >= n:
                    index[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(token)

    def sync(self, tokens: Sequence[int]) -> None:
        """Catch up with `tokens` (which extend what was seen); rebuild if they do not."""
        seen = len(self.tokens)
        if len(tokens) < seen or tokens[seen - 1:seen] != self.tokens[seen - 1:seen]:
            self.tokens = []
            self._follower = {n: {} for n in self.ngram_sizes}
            seen = 0
        self.extend(tokens[seen:])

    def propose(self, k: int) -> list[int]:
        """Up to `k` draft tokens continuing the current tokens; empty when no n-gram matches."""
        tokens = self.tokens
        if k <= 0:
            return []
        for n in self.ngram_sizes:
            if len(tokens) <= n:
                continue
            start = self._follower[n].get(tuple(tokens[-n:]))
            if start is not None:
                return tokens[start:start + k]
        return []
