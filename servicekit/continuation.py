"""The one continuation rule: how an answer that broke after some tokens is decoded to its end.

A continuation is a new request whose prompt is the original prompt followed by the tokens already
delivered, and whose `max_tokens` is the original budget less those tokens. Greedy, it adds the very
tokens the broken request would have added, so the caller sees one answer, no token repeated or
lost. When nothing is left to decode, no request is made and the answer ends as delivered:

- the budget is spent (every token arrived, only the end was lost): it ends `length`;
- the last token delivered is a stop token (`stop_token_ids`: the request's own, plus the model's
  end-of-sequence ids unless it ignores them): it ends `stop`.

Nothing delivered is a continuation too: the whole prompt with the whole budget (a plain retry).

Every place that continues an answer applies this rule: the orchestrator's keeper (a replica died
after the first token, or a caller re-issued its request to another orchestrator), the native
engine's disaggregated fall-back (`inference_svc/disagg/sender.py`) and vLLM's
(`inference_svc/vllm_backend/handoff.py`), whose shared decision is
`inference_svc/kv_transfer/handoff.py`'s. Each builds its request from `Continuation` in its own
message types; this module knows token ids only (it sits below `protos`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

# What a request's `max_tokens` of 0 means on every backend: the server's default budget (`budget`).
DEFAULT_MAX_TOKENS = 256
LENGTH = "length"           # nothing left: the budget is spent
STOP = "stop"               # nothing left: a stop token was delivered


@dataclass(frozen=True)
class Continuation:
    """What decodes the rest of an answer after `delivered`: `max_tokens` more tokens after the prompt
    plus `delivered` (`prompt_ids`), or nothing when `ended` says why the answer is complete."""

    delivered: tuple[int, ...]
    max_tokens: int                 # the budget left (0 when `ended`)
    ended: str | None = None        # LENGTH or STOP when nothing is left to decode; None otherwise

    @property
    def nothing_left(self) -> bool:
        return self.ended is not None

    def prompt_ids(self, prompt: Sequence[int]) -> list[int]:
        """The continuation's prompt as token ids: the original prompt, then the delivered tokens."""
        return [*prompt, *self.delivered]


def budget(max_tokens: int) -> int:
    """The tokens a request's `max_tokens` allows (a proto's 0: `DEFAULT_MAX_TOKENS`)."""
    return max_tokens or DEFAULT_MAX_TOKENS


def continue_after(delivered: Sequence[int], max_tokens: int, stop_token_ids: Collection[int] = ()) -> Continuation:
    """The continuation of an answer allowed `max_tokens` (already resolved: `budget`) that broke after
    the tokens `delivered`. More tokens delivered than allowed is a caller's error (ValueError)."""
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    delivered = tuple(delivered)
    if len(delivered) > max_tokens:
        raise ValueError(f"{len(delivered)} tokens delivered, more than max_tokens {max_tokens}")
    if delivered and delivered[-1] in stop_token_ids:
        return Continuation(delivered, 0, STOP)
    left = max_tokens - len(delivered)
    if left == 0:
        return Continuation(delivered, 0, LENGTH)
    return Continuation(delivered, left)
