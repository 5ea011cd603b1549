"""Token counting for synthesized documents: the embedded model's tokenizer or a calibrated estimate.

`EmbeddedTokenCounter` counts exactly with the embedded model's tokenizer (`--tokenizer
embedded`, the default; it loads transformers only when asked). `ApproxTokenCounter` counts
words and punctuation marks times 1.211, the ratio measured against that tokenizer over the
whole python-3.11-docs store (per passage within about 10%; `--tokenizer approx`).
`DocTokens` caches a document's count, since a document repeats along an update stream.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any, Protocol

from retriever_svc.replay.trace import TraceDocument

APPROX_TOKENS_PER_WORD = 1.211       # SmolLM2 tokens / approx words over python-3.11-docs


class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...

    def cut(self, text: str, tokens: int) -> str:
        """The longest prefix of `text` with at most `tokens` tokens (cut at a token boundary)."""
        ...


class EmbeddedTokenCounter:
    """Exact counts with the embedded model's tokenizer (no special tokens)."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tokenizer, self.name = tokenizer, name

    @classmethod
    def load(cls, model_dir: Path | None = None) -> EmbeddedTokenCounter:
        from transformers import AutoTokenizer

        from inference_svc.embedded_model import MODEL_NAME, embedded_model_dir

        path = Path(model_dir) if model_dir is not None else embedded_model_dir()
        if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
            raise FileNotFoundError(f"no tokenizer in {path}: prepare the embedded model first, "
                                    "or use --tokenizer approx")
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokenizer.model_max_length = sys.maxsize         # we count documents, not model inputs: no length warning
        return cls(tokenizer, f"{MODEL_NAME} tokenizer")

    def count(self, text: str) -> int:
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def cut(self, text: str, tokens: int) -> str:
        encoded = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if len(encoded["input_ids"]) <= tokens:
            return text
        return text[:encoded["offset_mapping"][tokens - 1][1]] if tokens > 0 else ""


class ApproxTokenCounter:
    """Words and punctuation marks times a ratio calibrated to the embedded model's tokenizer."""

    _WORD = re.compile(r"\w+|[^\w\s]")

    def __init__(self, tokens_per_word: float = APPROX_TOKENS_PER_WORD) -> None:
        self.ratio = tokens_per_word
        self.name = f"approx ({tokens_per_word} x words and punctuation, calibrated to SmolLM2-135M-Instruct)"

    def count(self, text: str) -> int:
        return round(len(self._WORD.findall(text)) * self.ratio)

    def cut(self, text: str, tokens: int) -> str:
        keep = math.floor(tokens / self.ratio)
        if keep <= 0:
            return ""
        for i, match in enumerate(self._WORD.finditer(text)):
            if i == keep - 1:
                return text[:match.end()]
        return text


class DocTokens:
    """A document's token count, cached by id and text (a document repeats along an update stream)."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._cache: dict[tuple[str, str], int] = {}

    def __call__(self, doc: TraceDocument) -> int:
        key = (doc.id, doc.text)
        if key not in self._cache:
            self._cache[key] = self.counter.count(doc.text)
        return self._cache[key]
