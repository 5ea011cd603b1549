"""The passages synthesized documents and questions are cut from."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any

from load_tests.synth.tokens import TokenCounter
from retriever_svc.replay.trace import TraceDocument

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class PassagePool:
    """The store's passages in row order (pages stay together); documents are runs of them."""

    def __init__(self, passages: Sequence[Any], counter: TokenCounter) -> None:
        if not passages:
            raise ValueError("the passage store is empty")
        self.passages, self.counter = list(passages), counter
        self._tokens: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.passages)

    def tokens(self, row: int) -> int:
        if row not in self._tokens:
            self._tokens[row] = self.counter.count(self.passages[row].text)
        return self._tokens[row]

    def document(self, start: int, tokens: int) -> TraceDocument:
        """Consecutive passages from `start` (wrapping), joined and cut to `tokens` tokens."""
        texts: list[str] = []
        have, row = 0, start % len(self)
        for _ in range(len(self)):
            texts.append(self.passages[row].text)
            have += self.tokens(row)
            row = (row + 1) % len(self)
            if have >= tokens:
                break
        text = self.counter.cut("\n\n".join(texts), tokens).strip() or texts[0]
        first = self.passages[start % len(self)]
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
        return TraceDocument(id=f"{first.id}#{digest}", title=first.title.split(" — ")[0], url=first.url, text=text)

    def question(self, row: int, rng: random.Random) -> str:
        """A prose sentence (6 to 30 words) of the passage at `row`, else its title."""
        passage = self.passages[row]
        sentences = [s for s in _SENTENCE_END.split(" ".join(passage.text.split())) if 6 <= len(s.split()) <= 30]
        return rng.choice(sentences) if sentences else (passage.title or passage.text[:80] or passage.id)
