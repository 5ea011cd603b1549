"""A streamed prompt's tokens on the vLLM backend: head + context + suffix, tokenized per segment.

The same `SegmentTokenizer` and the same input errors as the native engine (`EngineInputError`,
`PromptTooLongError`), checked by the shared `rpc.limits.PromptLimits`, so the servicer answers bad
input with the same gRPC statuses and messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from inference_svc.engine.engine import EngineInputError, lcp_length
from inference_svc.engine.request import Segment
from inference_svc.engine.tokenization import SegmentTokenizer
from inference_svc.rpc.limits import PromptLimits

__all__ = ["PromptLimits", "StreamedPrompt"]


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
