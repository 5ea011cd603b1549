"""Lifecycle events a request goes through, with monotonic timestamps."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class EventKind(enum.Enum):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    KV_ON_GPU = "KV_ON_GPU"                      # the whole current context is computed and on the device
    PREEMPTED_SWAP = "PREEMPTED_SWAP"
    PREEMPTED_RECOMPUTE = "PREEMPTED_RECOMPUTE"
    INVALIDATED = "INVALIDATED"                  # count: tokens of KV dropped by an update
    TOKEN = "TOKEN"                              # a generated token (token_id, text delta)
    FIRST_TOKEN = "FIRST_TOKEN"
    FINISHED = "FINISHED"                        # detail: the finish reason
    ERROR = "ERROR"
    # disaggregated prefill (inference_svc/disagg): raised by the transfer, not by the engine
    KV_TRANSFER_START = "KV_TRANSFER_START"      # detail: the decode replica
    KV_TRANSFER_CHUNK = "KV_TRANSFER_CHUNK"      # count: bytes; detail: tokens, blocks, ms
    KV_HANDOFF = "KV_HANDOFF"                    # the decode replica holds the prompt's KV and decodes
    KV_TRANSFER_FALLBACK = "KV_TRANSFER_FALLBACK"  # detail: why the prefill replica decodes itself


@dataclass(frozen=True)
class EngineEvent:
    request_id: str
    kind: EventKind
    time: float                 # the engine clock (time.monotonic by default)
    count: int = 0
    token_id: int | None = None
    text: str = ""
    detail: str = ""
