"""GetStats' counters, counted the same way on both backends.

Both backends keep an `EngineCounters` (the native engine its own; the vLLM backend fills one from vLLM's
iteration stats and its requests, `vllm_backend.stats`) and turn it into the message here, field by
field by name, so a counter one backend has is never missing or renamed on the other. What counts as a
request is one rule for both: a request is received once the backend accepted its open (a prompt refused
at open is no request), and ends exactly once, finished or aborted; `tokens_invalidated` counts the
computed tokens updates made invalid, and a request's `done` carries its own appends and updates.
"""

from __future__ import annotations

from dataclasses import fields

from inference_svc.engine.engine import EngineCounters
from protos import inference_pb2

PROTO_COUNTERS = frozenset(f.name for f in inference_pb2.EngineCounters.DESCRIPTOR.fields)
COUNTER_NAMES = tuple(f.name for f in fields(EngineCounters) if f.name in PROTO_COUNTERS)


def counters_to_proto(counters: EngineCounters) -> inference_pb2.EngineCounters:
    return inference_pb2.EngineCounters(**{name: getattr(counters, name) for name in COUNTER_NAMES})
