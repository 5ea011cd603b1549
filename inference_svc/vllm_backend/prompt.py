"""A streamed prompt's tokens on the vLLM backend: head + context + suffix, tokenized per segment.

The same `SegmentTokenizer` and the same input errors as the native engine (`EngineInputError`,
`PromptTooLongError`), so the servicer answers bad input with the same gRPC statuses.
"""

from __future__ import annotations

from collections.abc import Sequence

from inference_svc.engine.engine import EngineInputError, PromptTooLongError, lcp_length
from inference_svc.engine.request import Segment
from inference_svc.engine.tokenization import SegmentTokenizer


class PromptLimits:
    """What a prompt must satisfy on this engine: token ids in the vocabulary, and room for one
    generated token within the longest sequence the engine holds."""

    def __init__(self, vocab_size: int, max_model_len: int, kv_tokens: int) -> None:
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.kv_tokens = kv_tokens

    @property
    def max_sequence_tokens(self) -> int:
        return min(self.max_model_len, self.kv_tokens)

    def check_ids(self, segments: Sequence[Segment]) -> None:
        for segment in segments:
            if segment.token_ids is not None and any(not 0 <= t < self.vocab_size for t in segment.token_ids):
                raise EngineInputError(f"token ids must be in [0, {self.vocab_size})")

    def check_fits(self, num_tokens: int) -> None:
        limit = self.max_sequence_tokens - 1
        if num_tokens > limit:
            raise PromptTooLongError(f"prompt too long: {num_tokens} tokens; the limit is {limit} (model context "
                                     f"{self.max_model_len}, KV cache {self.kv_tokens} tokens)")


class StreamedPrompt:
    """Each method validates first and changes nothing when it raises."""

    def __init__(self, tokenizer: SegmentTokenizer, limits: PromptLimits) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.head: list[int] = []
        self.context: list[int] = []
        self.suffix: list[int] = []

    @property
    def tokens(self) -> list[int]:
        return self.head + self.context + self.suffix

    def _encode(self, segments: Sequence[Segment]) -> list[int]:
        ids = self.tokenizer.encode_all(segments)
        self.limits.check_ids(segments)
        return ids

    def open(self, segments: Sequence[Segment]) -> list[int]:
        head = self._encode(segments)
        self.limits.check_fits(len(head))
        self.head = head
        return head

    def append(self, segments: Sequence[Segment]) -> list[int]:
        """Returns the new tokens."""
        new = self._encode(segments)
        self.limits.check_fits(len(self.head) + len(self.context) + len(new))
        self.context = self.context + new
        return new

    def update(self, segments: Sequence[Segment]) -> int:
        """Replace the context; returns the token LCP of the old and new prompt."""
        context = self._encode(segments)
        self.limits.check_fits(len(self.head) + len(context))
        old = self.tokens
        self.context = context
        return lcp_length(old, self.tokens)

    def stable_prefix_tokens(self, segments: Sequence[Segment]) -> int:
        return self.tokenizer.stable_prefix_tokens(segments)

    def finish(self, segments: Sequence[Segment]) -> list[int]:
        """Returns the suffix tokens."""
        suffix = self._encode(segments)
        total = len(self.head) + len(self.context) + len(suffix)
        if total == 0:
            raise EngineInputError("the prompt is empty")
        self.limits.check_fits(total)
        self.suffix = suffix
        return suffix
