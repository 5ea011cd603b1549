"""`RequestSummary`: how a backend tells the servicer that a request ended.

Each backend puts one on the request's event queue after its last event (the native engine
thread when the engine releases the request, the vLLM backend when vLLM's output ends); the
servicer turns it into the `done` message (`convert.done_to_proto`).
"""

from __future__ import annotations

from dataclasses import dataclass

from inference_svc.engine.request import FinishReason, RequestStats


@dataclass(frozen=True)
class RequestSummary:
    """Everything the `done` message needs, read when the request ended."""

    request_id: str
    finish_reason: FinishReason
    stats: RequestStats
    prompt_tokens: int
    output_token_ids: tuple[int, ...]
    text: str          # the answer, cut before a stop string (Request.output_text)
    min_logit_gap: float | None = None   # confidence, for requests that track it (session queries)
