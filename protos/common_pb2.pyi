from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LifecycleEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIFECYCLE_EVENT_KIND_UNSPECIFIED: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_QUEUED: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_SCHEDULED: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_KV_ON_GPU: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_PREEMPTED_SWAP: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_PREEMPTED_RECOMPUTE: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_INVALIDATED: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_FIRST_TOKEN: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_FINISHED: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_ERROR: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_PREFILL_PROGRESS: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_KV_TRANSFER_START: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_KV_TRANSFER_CHUNK: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_KV_HANDOFF: _ClassVar[LifecycleEventKind]
    LIFECYCLE_EVENT_KIND_KV_TRANSFER_FALLBACK: _ClassVar[LifecycleEventKind]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
LIFECYCLE_EVENT_KIND_UNSPECIFIED: LifecycleEventKind
LIFECYCLE_EVENT_KIND_QUEUED: LifecycleEventKind
LIFECYCLE_EVENT_KIND_SCHEDULED: LifecycleEventKind
LIFECYCLE_EVENT_KIND_KV_ON_GPU: LifecycleEventKind
LIFECYCLE_EVENT_KIND_PREEMPTED_SWAP: LifecycleEventKind
LIFECYCLE_EVENT_KIND_PREEMPTED_RECOMPUTE: LifecycleEventKind
LIFECYCLE_EVENT_KIND_INVALIDATED: LifecycleEventKind
LIFECYCLE_EVENT_KIND_FIRST_TOKEN: LifecycleEventKind
LIFECYCLE_EVENT_KIND_FINISHED: LifecycleEventKind
LIFECYCLE_EVENT_KIND_ERROR: LifecycleEventKind
LIFECYCLE_EVENT_KIND_PREFILL_PROGRESS: LifecycleEventKind
LIFECYCLE_EVENT_KIND_KV_TRANSFER_START: LifecycleEventKind
LIFECYCLE_EVENT_KIND_KV_TRANSFER_CHUNK: LifecycleEventKind
LIFECYCLE_EVENT_KIND_KV_HANDOFF: LifecycleEventKind
LIFECYCLE_EVENT_KIND_KV_TRANSFER_FALLBACK: LifecycleEventKind
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_ERROR: FinishReason

class Segment(_message.Message):
    __slots__ = ("text", "token_ids", "key", "stability")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STABILITY_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: TokenIds
    key: str
    stability: float
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., key: _Optional[str] = ..., stability: _Optional[float] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "stop_token_ids", "ignore_eos", "speculation", "kv_reuse", "blend_recompute")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    KV_REUSE_FIELD_NUMBER: _ClassVar[int]
    BLEND_RECOMPUTE_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    speculation: str
    kv_reuse: str
    blend_recompute: float
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., speculation: _Optional[str] = ..., kv_reuse: _Optional[str] = ..., blend_recompute: _Optional[float] = ...) -> None: ...

class LifecycleEvent(_message.Message):
    __slots__ = ("kind", "monotonic_s", "unix_ms", "detail", "count")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MONOTONIC_S_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    kind: LifecycleEventKind
    monotonic_s: float
    unix_ms: int
    detail: str
    count: int
    def __init__(self, kind: _Optional[_Union[LifecycleEventKind, str]] = ..., monotonic_s: _Optional[float] = ..., unix_ms: _Optional[int] = ..., detail: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class GeneratedToken(_message.Message):
    __slots__ = ("id", "text", "index")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: str
    index: int
    def __init__(self, id: _Optional[int] = ..., text: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class RequestStats(_message.Message):
    __slots__ = ("ttft_from_open_s", "ttft_from_last_chunk_s", "prompt_tokens", "tokens_computed", "tokens_invalidated", "preemptions_swap", "preemptions_recompute", "time_queued_s", "generated_tokens", "prefix_cache_hit_tokens", "num_appends", "num_updates", "e2e_s", "decode_s", "draft_tokens", "accepted_draft_tokens", "kv_reuse", "blend_reused_tokens", "blend_recomputed_tokens", "chunk_cache_hits", "chunk_cache_lookups")
    TTFT_FROM_OPEN_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_FROM_LAST_CHUNK_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_COMPUTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_SWAP_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_RECOMPUTE_FIELD_NUMBER: _ClassVar[int]
    TIME_QUEUED_S_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_APPENDS_FIELD_NUMBER: _ClassVar[int]
    NUM_UPDATES_FIELD_NUMBER: _ClassVar[int]
    E2E_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_REUSE_FIELD_NUMBER: _ClassVar[int]
    BLEND_REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLEND_RECOMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CACHE_LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    ttft_from_open_s: float
    ttft_from_last_chunk_s: float
    prompt_tokens: int
    tokens_computed: int
    tokens_invalidated: int
    preemptions_swap: int
    preemptions_recompute: int
    time_queued_s: float
    generated_tokens: int
    prefix_cache_hit_tokens: int
    num_appends: int
    num_updates: int
    e2e_s: float
    decode_s: float
    draft_tokens: int
    accepted_draft_tokens: int
    kv_reuse: str
    blend_reused_tokens: int
    blend_recomputed_tokens: int
    chunk_cache_hits: int
    chunk_cache_lookups: int
    def __init__(self, ttft_from_open_s: _Optional[float] = ..., ttft_from_last_chunk_s: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., tokens_computed: _Optional[int] = ..., tokens_invalidated: _Optional[int] = ..., preemptions_swap: _Optional[int] = ..., preemptions_recompute: _Optional[int] = ..., time_queued_s: _Optional[float] = ..., generated_tokens: _Optional[int] = ..., prefix_cache_hit_tokens: _Optional[int] = ..., num_appends: _Optional[int] = ..., num_updates: _Optional[int] = ..., e2e_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., draft_tokens: _Optional[int] = ..., accepted_draft_tokens: _Optional[int] = ..., kv_reuse: _Optional[str] = ..., blend_reused_tokens: _Optional[int] = ..., blend_recomputed_tokens: _Optional[int] = ..., chunk_cache_hits: _Optional[int] = ..., chunk_cache_lookups: _Optional[int] = ...) -> None: ...

class Document(_message.Message):
    __slots__ = ("id", "title", "url", "text", "score", "source", "stability")
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STABILITY_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    url: str
    text: str
    score: float
    source: str
    stability: float
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., url: _Optional[str] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., source: _Optional[str] = ..., stability: _Optional[float] = ...) -> None: ...
