"""Translate between `streamrag.v1` messages and the engine's plain Python objects.

Validation of caller-supplied values lives here: anything malformed raises `BadRequest`
(the servicer answers INVALID_ARGUMENT), a message past the size limits raises the engine's
`PromptTooLongError` (RESOURCE_EXHAUSTED, like a prompt longer than the context), so the
engine only ever sees well-formed input. The limits are documented in protos/inference.proto.
"""

from __future__ import annotations

import math

from inference_svc.engine.engine import PromptTooLongError
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.options import DEFAULT_SPECULATION
from inference_svc.engine.request import FinishReason, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.rpc.summary import RequestSummary
from protos import common_pb2, inference_pb2
from servicekit.continuation import DEFAULT_MAX_TOKENS  # what max_tokens 0 means, on every backend

MAX_SEGMENTS_PER_MESSAGE = 4096
MAX_SEGMENT_CHARS = 1 << 20          # a 1 MiB document is already far past any context
MAX_REQUEST_ID_CHARS = 256


class BadRequest(ValueError):
    pass


def _stability(segment) -> float | None:
    if not segment.HasField("stability"):
        return None
    if not 0.0 <= segment.stability <= 1.0:       # NaN fails both comparisons too
        raise BadRequest(f"a segment's stability must be in [0, 1], got {segment.stability}")
    return segment.stability


def segments_from_proto(segments) -> list[Segment]:
    if len(segments) > MAX_SEGMENTS_PER_MESSAGE:
        raise PromptTooLongError(f"prompt too long: {len(segments)} segments in one message; "
                                 f"the limit is {MAX_SEGMENTS_PER_MESSAGE} per message")
    out = []
    for i, seg in enumerate(segments):
        kind = seg.WhichOneof("content")
        key = seg.key or None
        if kind == "text":
            if len(seg.text) > MAX_SEGMENT_CHARS:
                raise PromptTooLongError(f"prompt too long: segment {i} has {len(seg.text)} characters; "
                                         f"the limit is {MAX_SEGMENT_CHARS} per segment")
            out.append(Segment(text=seg.text, key=key, stability=_stability(seg)))
        elif kind == "token_ids":
            if len(seg.token_ids.ids) > MAX_SEGMENT_CHARS:
                raise PromptTooLongError(f"prompt too long: segment {i} has {len(seg.token_ids.ids)} token ids; "
                                         f"the limit is {MAX_SEGMENT_CHARS} per segment")
            out.append(Segment(token_ids=tuple(seg.token_ids.ids), key=key, stability=_stability(seg)))
        else:
            raise BadRequest(f"segment {i} has neither text nor token_ids")
    return out


def sampling_from_proto(params: common_pb2.SamplingParams, has_field: bool) -> SamplingParams:
    """Proto zero values mean 'server default' (top_p 0 -> 1.0, max_tokens 0 -> 256, speculation "" ->
    DEFAULT_SPECULATION)."""
    if not has_field:
        return SamplingParams(max_tokens=DEFAULT_MAX_TOKENS)
    if not math.isfinite(params.temperature) or not math.isfinite(params.top_p):
        raise BadRequest("temperature and top_p must be finite numbers")
    sampling = SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p if params.top_p != 0 else 1.0,
        top_k=params.top_k,
        max_tokens=params.max_tokens if params.max_tokens != 0 else DEFAULT_MAX_TOKENS,
        seed=params.seed if params.HasField("seed") else None,
        stop_token_ids=tuple(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        stop=tuple(params.stop),
        speculation=params.speculation or DEFAULT_SPECULATION,
        kv_reuse=params.kv_reuse,
        blend_recompute=params.blend_recompute if params.HasField("blend_recompute") else None,
    )
    try:
        return sampling.validate()
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc


def check_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID_CHARS or any(not c.isprintable() for c in request_id):
        raise BadRequest(f"request_id must be printable and at most {MAX_REQUEST_ID_CHARS} characters")


LIFECYCLE_KINDS = {
    EventKind.QUEUED: common_pb2.LIFECYCLE_EVENT_KIND_QUEUED,
    EventKind.SCHEDULED: common_pb2.LIFECYCLE_EVENT_KIND_SCHEDULED,
    EventKind.KV_ON_GPU: common_pb2.LIFECYCLE_EVENT_KIND_KV_ON_GPU,
    EventKind.PREEMPTED_SWAP: common_pb2.LIFECYCLE_EVENT_KIND_PREEMPTED_SWAP,
    EventKind.PREEMPTED_RECOMPUTE: common_pb2.LIFECYCLE_EVENT_KIND_PREEMPTED_RECOMPUTE,
    EventKind.INVALIDATED: common_pb2.LIFECYCLE_EVENT_KIND_INVALIDATED,
    EventKind.FIRST_TOKEN: common_pb2.LIFECYCLE_EVENT_KIND_FIRST_TOKEN,
    EventKind.FINISHED: common_pb2.LIFECYCLE_EVENT_KIND_FINISHED,
    EventKind.ERROR: common_pb2.LIFECYCLE_EVENT_KIND_ERROR,
    EventKind.KV_TRANSFER_START: common_pb2.LIFECYCLE_EVENT_KIND_KV_TRANSFER_START,
    EventKind.KV_TRANSFER_CHUNK: common_pb2.LIFECYCLE_EVENT_KIND_KV_TRANSFER_CHUNK,
    EventKind.KV_HANDOFF: common_pb2.LIFECYCLE_EVENT_KIND_KV_HANDOFF,
    EventKind.KV_TRANSFER_FALLBACK: common_pb2.LIFECYCLE_EVENT_KIND_KV_TRANSFER_FALLBACK,
}
FINISH_REASONS = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: common_pb2.FINISH_REASON_ABORT,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}


def event_to_proto(event: EngineEvent, token_index: int, clock_offset_s: float) -> inference_pb2.InferenceEvent:
    """`clock_offset_s` turns the engine's monotonic clock into unix time."""
    if event.kind is EventKind.TOKEN:
        return inference_pb2.InferenceEvent(
            token=common_pb2.GeneratedToken(id=event.token_id, text=event.text, index=token_index))
    return inference_pb2.InferenceEvent(lifecycle=common_pb2.LifecycleEvent(
        kind=LIFECYCLE_KINDS[event.kind], monotonic_s=event.time, unix_ms=int((event.time + clock_offset_s) * 1000),
        detail=event.detail, count=event.count))


def done_to_proto(summary: RequestSummary, text: str) -> inference_pb2.InferenceEvent:
    """`text`: the output text (the servicer passes what it streamed, so the two always agree)."""
    s = summary.stats
    end = s.finish_time if s.finish_time is not None else s.last_input_time
    stats = common_pb2.RequestStats(
        ttft_from_open_s=s.ttft_from_open_s or 0.0,
        ttft_from_last_chunk_s=s.ttft_from_last_input_s or 0.0,
        time_queued_s=s.time_queued_s,
        e2e_s=end - s.arrival_time,
        decode_s=(end - s.first_token_time) if s.first_token_time is not None else 0.0,
        prompt_tokens=summary.prompt_tokens,
        tokens_computed=s.tokens_computed,
        tokens_invalidated=s.tokens_invalidated,
        preemptions_swap=s.preemptions_swap,
        preemptions_recompute=s.preemptions_recompute,
        generated_tokens=len(summary.output_token_ids),
        prefix_cache_hit_tokens=s.prefix_cache_hit_tokens,
        num_appends=s.num_appends,
        num_updates=s.num_updates,
        draft_tokens=s.draft_tokens,
        accepted_draft_tokens=s.accepted_draft_tokens,
        kv_reuse=s.kv_reuse,
        blend_reused_tokens=s.blend_reused_tokens,
        blend_recomputed_tokens=s.blend_recomputed_tokens,
        chunk_cache_hits=s.chunk_cache_hits,
        chunk_cache_lookups=s.chunk_cache_lookups,
    )
    return inference_pb2.InferenceEvent(done=inference_pb2.InferenceDone(
        finish_reason=FINISH_REASONS[summary.finish_reason], stats=stats, text=text,
        request_id=summary.request_id))
