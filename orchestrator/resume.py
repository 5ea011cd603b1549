"""What a continuation is made of, in the orchestrator's messages: the saved prompt, the request, the end.

The rule itself is `servicekit/continuation.py`'s (the prompt plus the tokens already delivered,
`max_tokens` less those tokens; nothing left ends the answer as delivered). Greedy, a continuation
adds the very tokens the broken request would have added, so the caller sees one answer. The
keeper (keeper.py) uses it twice:

- a replica dies or stops answering after an answer's first token: another replica continues it;
- the orchestrator serving an Ask dies: the caller re-issues the Ask (`AskRequest.resume`: the
  same request id, the tokens it has) to a live orchestrator, which reads the prompt that the
  dead one saved in the lifecycle store when it was complete (`save_prompt`: at `finish` when
  streaming, before `Generate` for the baseline) and continues from there.

Each continuation is recorded as a `CONTINUED` event (keeper.py): the tokens it continued after, the
KV its replica computed again for them (`tokens_computed`, `prefix_cache_hit_tokens`) and the
time from the break to its first token (`first_token_s`), so what a resume costs is read back
from the store.

Tokens are only sent to the caller once the prompt is in Redis (the keeper waits for the store's
flush, `PROMPT_FLUSH_S` at most, and not while Redis is down), so a broken stream with tokens
always has a prompt to continue from, Redis faults aside.

Limits: a sampled (non-greedy) answer continues with the same parameters but not the same draw;
a stop string split across the break is not seen.
"""

from __future__ import annotations

import base64
import uuid

from orchestrator.lifecycle_store import LifecycleStore
from orchestrator.recording import record_fields
from protos import common_pb2, inference_pb2, orchestrator_pb2
from servicekit.continuation import STOP, budget, continue_after

PROMPT_FIELD = "prompt"        # the request's hash field holding its AskPrompt (base64 of the message)
PROMPT_FLUSH_S = 2.0           # the longest the first token waits for the prompt to reach Redis


def continuation(prompt: orchestrator_pb2.AskPrompt, token_ids, request_id: str, stop_token_ids=(),
                 ) -> tuple[inference_pb2.GenerateRequest | None, str | None]:
    """The request that decodes the rest of the answer after `token_ids`, or (None, why) when nothing
    is left (`continuation.LENGTH` or `STOP`: only the end was lost). Its id is new
    (`<id>@resume-<hex>`): a replica may still hold the broken request under the old one."""
    rest = continue_after(token_ids, budget(prompt.sampling.max_tokens),
                          (*prompt.sampling.stop_token_ids, *stop_token_ids))
    if rest.nothing_left:
        return None, rest.ended
    sampling = common_pb2.SamplingParams()
    sampling.CopyFrom(prompt.sampling)
    sampling.max_tokens = rest.max_tokens
    segments = list(prompt.segments)
    if rest.delivered:
        segments.append(common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=rest.delivered)))
    return inference_pb2.GenerateRequest(request_id=f"{request_id}@resume-{uuid.uuid4().hex[:8]}",
                                         segments=segments, sampling=sampling), None


def whole_answer(done: inference_pb2.InferenceDone, before_text: str,
                 before_tokens: int) -> inference_pb2.InferenceDone:
    """A continuation's `done` as the whole answer's: the text and token counts of what came before
    it added (the delivered tokens were part of its prompt)."""
    whole = inference_pb2.InferenceDone()
    whole.CopyFrom(done)
    whole.text = before_text + done.text
    whole.stats.generated_tokens = done.stats.generated_tokens + before_tokens
    whole.stats.prompt_tokens = max(0, done.stats.prompt_tokens - before_tokens)
    return whole


def end_of_answer(before_text: str, before_tokens: int, ended: str) -> inference_pb2.InferenceDone:
    """The end of an answer with nothing left to decode after the break (`ended`: why)."""
    reason = common_pb2.FINISH_REASON_STOP if ended == STOP else common_pb2.FINISH_REASON_LENGTH
    done = inference_pb2.InferenceDone(text=before_text, finish_reason=reason)
    done.stats.generated_tokens = before_tokens
    return done


async def save_prompt(store: LifecycleStore, request_id: str, prompt: orchestrator_pb2.AskPrompt) -> None:
    await record_fields(store, request_id, **{PROMPT_FIELD: base64.b64encode(prompt.SerializeToString()).decode()})


async def load_prompt(store: LifecycleStore, request_id: str) -> orchestrator_pb2.AskPrompt | None:
    """The prompt an orchestrator saved for the request; None if it saved none (or the record expired).
    Raises `StoreUnavailable` while Redis is down."""
    stored = await store.get(request_id)
    encoded = stored.extra.get(PROMPT_FIELD) if stored is not None else None
    if not encoded:
        return None
    return orchestrator_pb2.AskPrompt.FromString(base64.b64decode(encoded))
