"""Messages of the KV transfer: the metadata key that asks for a hand-off, the layout and sampling
on the wire, and decode-side events turned back into the engine's (for the prefill replica's call)."""

from __future__ import annotations

from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.kv_export import KvLayout
from inference_svc.engine.request import FinishReason
from inference_svc.engine.sampler import SamplingParams
from inference_svc.rpc.convert import FINISH_REASONS, LIFECYCLE_KINDS
from protos import common_pb2, kv_transfer_pb2
from protos.metadata import DECODE_TARGET_KEY  # the StreamPrompt metadata naming the decode replica

EVENT_KINDS = {proto: kind for kind, proto in LIFECYCLE_KINDS.items()}
FINISH_REASON_OF = {proto: reason for reason, proto in FINISH_REASONS.items()}


def layout_to_proto(layout: KvLayout) -> kv_transfer_pb2.KvLayout:
    return kv_transfer_pb2.KvLayout(num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
                                    head_dim=layout.head_dim, block_size=layout.block_size, dtype=layout.dtype)


def layout_from_proto(message: kv_transfer_pb2.KvLayout) -> KvLayout:
    return KvLayout(message.num_layers, message.num_kv_heads, message.head_dim, message.block_size, message.dtype)


def sampling_to_proto(sampling: SamplingParams) -> common_pb2.SamplingParams:
    """The inverse of `convert.sampling_from_proto` (every field explicit)."""
    message = common_pb2.SamplingParams(
        temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
        max_tokens=sampling.max_tokens, stop_token_ids=list(sampling.stop_token_ids), ignore_eos=sampling.ignore_eos,
        stop=list(sampling.stop), speculation=sampling.speculation)
    if sampling.seed is not None:
        message.seed = sampling.seed
    return message


def event_from_proto(request_id: str, event: common_pb2.LifecycleEvent, time: float) -> EngineEvent | None:
    """A decode-side lifecycle event as this replica's engine event (None for an unknown kind)."""
    kind = EVENT_KINDS.get(event.kind)
    if kind is None:
        return None
    return EngineEvent(request_id, kind, time, count=event.count, detail=event.detail)


def finish_reason(proto_reason: int) -> FinishReason:
    return FINISH_REASON_OF.get(proto_reason, FinishReason.ERROR)


__all__ = ["DECODE_TARGET_KEY", "EventKind", "event_from_proto", "finish_reason", "layout_from_proto",
           "layout_to_proto", "sampling_to_proto"]
