"""Per-segment tokenization with a cache keyed by the segment's key.

A prompt's tokens are the concatenation of each segment's own tokens, so the same
documents give the same tokens whether they arrived in one message or many (what makes LCP
reuse exact, and the streamed and one-shot paths identical). Segments are never joined
before tokenizing. No BOS/EOS is added: chat-format pieces travel as text segments and
special-token text such as `<|im_start|>` is recognised.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from inference_svc.engine.request import Segment


class SegmentTokenizer:
    def __init__(self, tokenizer: Any, cache_size: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.cache_size = cache_size
        self._cache: OrderedDict[str, tuple[str, list[int]]] = OrderedDict()
        self.hits = 0

    def encode(self, segment: Segment) -> list[int]:
        if segment.token_ids is not None:
            return list(segment.token_ids)
        if segment.key:
            cached = self._cache.get(segment.key)
            if cached is not None and cached[0] == segment.text:
                self._cache.move_to_end(segment.key)
                self.hits += 1
                return cached[1]
        ids = list(self.tokenizer.encode(segment.text, add_special_tokens=False))
        if segment.key:
            self._cache[segment.key] = (segment.text, ids)
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return ids

    def encode_all(self, segments: Iterable[Segment]) -> list[int]:
        ids: list[int] = []
        for segment in segments:
            ids.extend(self.encode(segment))
        return ids

    def stable_prefix_tokens(self, segments: Iterable[Segment]) -> int:
        """Tokens of the leading segments not marked likely to be replaced by the next refinement
        (`Segment.likely_replaced`): how far ahead a non-final update is prefilled, on both backends."""
        tokens = 0
        for segment in segments:
            if segment.likely_replaced:
                break
            tokens += len(self.encode(segment))
        return tokens

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
