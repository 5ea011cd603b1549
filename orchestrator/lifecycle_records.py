"""What the lifecycle store keeps, as read back: the Redis keys of a request, its decoded record
(`StoredRequest`, with its `StoredEvent`s) and the `RequestRecord` the servicer returns (`to_proto`).

How the keys are laid out and written: lifecycle_store.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from protos import common_pb2, orchestrator_pb2

log = logging.getLogger(__name__)

RECENT_KEY = "streamrag:requests:recent"
REDIS_GAP = "REDIS_GAP"

_STATE_PREFIX = "REQUEST_STATE_"
RETRIEVER_PREFIX = "RETRIEVER_CHOICE_"
_LIFECYCLE_PREFIX = "LIFECYCLE_EVENT_KIND_"
_RECORD_FIELDS = frozenset({
    "question", "state", "replica", "retriever", "streamed", "created_unix_ms", "updated_unix_ms", "answer",
    "ttft_from_question_s", "ttft_from_retrieval_end_s", "error", "stats"})


def request_key(request_id: str) -> str:
    """The hash holding one request's fields."""
    return f"streamrag:req:{request_id}"


def events_key(request_id: str) -> str:
    """The Redis Stream holding one request's events."""
    return f"streamrag:req:{request_id}:events"


def lifecycle_kind_name(kind: int) -> str:
    """`LIFECYCLE_EVENT_KIND_QUEUED` -> "QUEUED", the kind string events are stored under."""
    return common_pb2.LifecycleEventKind.Name(kind).removeprefix(_LIFECYCLE_PREFIX)


class StoreUnavailable(Exception):
    """Redis cannot be reached, so stored records cannot be read (the servicer's UNAVAILABLE)."""


@dataclass
class StoredEvent:
    """One entry of a request's event stream."""

    stream_id: str  # "<ms>-<seq>", ordered as recorded
    kind: str  # "QUEUED", "RETRIEVAL_CHUNK", "REDIS_GAP", ...
    unix_ms: int
    fields: dict[str, str] = field(default_factory=dict)


@dataclass
class StoredRequest:
    """One request as stored: the hash's fields and (from `get`) its events, oldest first."""

    request_id: str
    question: str = ""
    state: str = ""  # RequestState name without its prefix: "RECEIVED", "FINISHED", ...
    replica: str = ""
    retriever: str = ""  # as given to `create`: "anns", "anns,crawler", "none", ...
    streamed: bool = False
    created_unix_ms: int = 0
    updated_unix_ms: int = 0
    answer: str = ""
    ttft_from_question_s: float = 0.0
    ttft_from_retrieval_end_s: float = 0.0
    error: str = ""
    stats: dict[str, float] = field(default_factory=dict)  # RequestStats field -> value
    extra: dict[str, str] = field(default_factory=dict)  # other hash fields given to `update`
    events: list[StoredEvent] = field(default_factory=list)

    @classmethod
    def from_redis(cls, request_id: str, fields: Mapping[str, str],
                   entries: Sequence[tuple[str, Mapping[str, str]]] = ()) -> StoredRequest:
        """Decode a hash (HGETALL) and stream entries (XRANGE) as written by `LifecycleStore`."""
        events = []
        for stream_id, entry in entries:
            rest = dict(entry)
            kind = rest.pop("kind", "")
            unix_ms = int(rest.pop("unix_ms", "") or stream_id.partition("-")[0] or 0)
            events.append(StoredEvent(stream_id, kind, unix_ms, rest))
        return cls(
            request_id=request_id,
            question=fields.get("question", ""),
            state=fields.get("state", ""),
            replica=fields.get("replica", ""),
            retriever=fields.get("retriever", ""),
            streamed=fields.get("streamed") == "1",
            created_unix_ms=int(fields.get("created_unix_ms") or 0),
            updated_unix_ms=int(fields.get("updated_unix_ms") or 0),
            answer=fields.get("answer", ""),
            ttft_from_question_s=float(fields.get("ttft_from_question_s") or 0.0),
            ttft_from_retrieval_end_s=float(fields.get("ttft_from_retrieval_end_s") or 0.0),
            error=fields.get("error", ""),
            stats=json.loads(fields["stats"]) if fields.get("stats") else {},
            extra={name: value for name, value in fields.items() if name not in _RECORD_FIELDS},
            events=events,
        )


def to_proto(stored: StoredRequest) -> orchestrator_pb2.RequestRecord:
    """The `RequestRecord` that `Orchestrator.GetRequest` returns for a stored request."""
    record = orchestrator_pb2.RequestRecord(
        request_id=stored.request_id,
        question=stored.question,
        state=_enum_value(orchestrator_pb2.RequestState, _STATE_PREFIX, stored.state),
        replica=stored.replica,
        retriever=_retriever_choice(stored.retriever),
        streamed=stored.streamed,
        created_unix_ms=stored.created_unix_ms,
        updated_unix_ms=stored.updated_unix_ms,
        answer=stored.answer,
        ttft_from_question_s=stored.ttft_from_question_s,
        ttft_from_retrieval_end_s=stored.ttft_from_retrieval_end_s,
        error=stored.error,
        tenant=stored.extra.get("tenant", ""),
        priority=int(stored.extra.get("priority", "0") or 0),
    )
    if stored.stats:
        record.stats.CopyFrom(_stats_proto(stored.stats))
    for event in stored.events:
        record.events.add(stream_id=event.stream_id, kind=event.kind, unix_ms=event.unix_ms, fields=event.fields)
    return record


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def state_name(state: int | str) -> str:
    """The short `RequestState` name of a value or (short or full) name; unknown ones are kept, with a warning."""
    full = _STATE_PREFIX + state.upper().removeprefix(_STATE_PREFIX) if isinstance(state, str) else ""
    try:
        full = orchestrator_pb2.RequestState.Name(state) if isinstance(state, int) else full
        orchestrator_pb2.RequestState.Value(full)
    except ValueError:
        log.warning("lifecycle store: unknown request state %r", state)
        return str(state)
    return full.removeprefix(_STATE_PREFIX)


def _retriever_choice(retriever: str) -> int:
    """"anns" -> ANNS, "anns,crawler" -> BOTH, "none" -> NONE; anything else UNSPECIFIED."""
    names = {name.strip().upper() for name in retriever.split(",") if name.strip()}
    if names == {"ANNS", "CRAWLER"}:
        names = {"BOTH"}
    if len(names) != 1:
        return orchestrator_pb2.RETRIEVER_CHOICE_UNSPECIFIED
    return _enum_value(orchestrator_pb2.RetrieverChoice, RETRIEVER_PREFIX, names.pop())


def _enum_value(enum: Any, prefix: str, name: str) -> int:
    try:
        return enum.Value(prefix + name)
    except ValueError:
        return 0


def stats_dict(stats: common_pb2.RequestStats | Mapping[str, float]) -> dict[str, float]:
    if isinstance(stats, common_pb2.RequestStats):
        return {f.name: getattr(stats, f.name) for f in stats.DESCRIPTOR.fields}
    return dict(stats)


def _stats_proto(stats: Mapping[str, float]) -> common_pb2.RequestStats:
    fields = common_pb2.RequestStats.DESCRIPTOR.fields_by_name
    floating = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)
    def decoded(name: str, value: Any) -> Any:
        kind = fields[name].type
        if kind == FieldDescriptor.TYPE_STRING:     # e.g. kv_reuse ("exact")
            return str(value)
        return float(value) if kind in floating else int(value)

    return common_pb2.RequestStats(**{name: decoded(name, value) for name, value in stats.items() if name in fields})
