from protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StreamPromptRequest(_message.Message):
    __slots__ = ("update",)
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    update: PromptUpdate
    def __init__(self, update: _Optional[_Union[PromptUpdate, _Mapping]] = ...) -> None: ...

class StreamPromptResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: InferenceEvent
    def __init__(self, event: _Optional[_Union[InferenceEvent, _Mapping]] = ...) -> None: ...

class PromptUpdate(_message.Message):
    __slots__ = ("open", "append", "update", "finish")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    open: PromptOpen
    append: PromptAppend
    update: PromptReplace
    finish: PromptFinish
    def __init__(self, open: _Optional[_Union[PromptOpen, _Mapping]] = ..., append: _Optional[_Union[PromptAppend, _Mapping]] = ..., update: _Optional[_Union[PromptReplace, _Mapping]] = ..., finish: _Optional[_Union[PromptFinish, _Mapping]] = ...) -> None: ...

class PromptOpen(_message.Message):
    __slots__ = ("request_id", "sampling", "priority", "segments", "policy_hint")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_HINT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    sampling: _common_pb2.SamplingParams
    priority: int
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.Segment]
    policy_hint: str
    def __init__(self, request_id: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., priority: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[_common_pb2.Segment, _Mapping]]] = ..., policy_hint: _Optional[str] = ...) -> None: ...

class PromptAppend(_message.Message):
    __slots__ = ("segments",)
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.Segment]
    def __init__(self, segments: _Optional[_Iterable[_Union[_common_pb2.Segment, _Mapping]]] = ...) -> None: ...

class PromptReplace(_message.Message):
    __slots__ = ("segments", "final_stage")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    FINAL_STAGE_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.Segment]
    final_stage: bool
    def __init__(self, segments: _Optional[_Iterable[_Union[_common_pb2.Segment, _Mapping]]] = ..., final_stage: _Optional[bool] = ...) -> None: ...

class PromptFinish(_message.Message):
    __slots__ = ("segments",)
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.Segment]
    def __init__(self, segments: _Optional[_Iterable[_Union[_common_pb2.Segment, _Mapping]]] = ...) -> None: ...

class InferenceEvent(_message.Message):
    __slots__ = ("lifecycle", "token", "done")
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    lifecycle: _common_pb2.LifecycleEvent
    token: _common_pb2.GeneratedToken
    done: InferenceDone
    def __init__(self, lifecycle: _Optional[_Union[_common_pb2.LifecycleEvent, _Mapping]] = ..., token: _Optional[_Union[_common_pb2.GeneratedToken, _Mapping]] = ..., done: _Optional[_Union[InferenceDone, _Mapping]] = ...) -> None: ...

class InferenceDone(_message.Message):
    __slots__ = ("finish_reason", "stats", "text", "request_id", "finish_detail")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    finish_reason: _common_pb2.FinishReason
    stats: _common_pb2.RequestStats
    text: str
    request_id: str
    finish_detail: str
    def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., stats: _Optional[_Union[_common_pb2.RequestStats, _Mapping]] = ..., text: _Optional[str] = ..., request_id: _Optional[str] = ..., finish_detail: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "segments", "sampling", "priority", "policy_hint")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    POLICY_HINT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.Segment]
    sampling: _common_pb2.SamplingParams
    priority: int
    policy_hint: str
    def __init__(self, request_id: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[_common_pb2.Segment, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., priority: _Optional[int] = ..., policy_hint: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: InferenceEvent
    def __init__(self, event: _Optional[_Union[InferenceEvent, _Mapping]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("model_info",)
    MODEL_INFO_FIELD_NUMBER: _ClassVar[int]
    model_info: ModelInfo
    def __init__(self, model_info: _Optional[_Union[ModelInfo, _Mapping]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "context_length", "block_size", "policy", "backend", "eviction_mode", "dtype", "device", "chat_format", "vocab_size", "token_budget")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    EVICTION_MODE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CHAT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    model: str
    context_length: int
    block_size: int
    policy: str
    backend: str
    eviction_mode: str
    dtype: str
    device: str
    chat_format: ChatFormat
    vocab_size: int
    token_budget: int
    def __init__(self, model: _Optional[str] = ..., context_length: _Optional[int] = ..., block_size: _Optional[int] = ..., policy: _Optional[str] = ..., backend: _Optional[str] = ..., eviction_mode: _Optional[str] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., chat_format: _Optional[_Union[ChatFormat, _Mapping]] = ..., vocab_size: _Optional[int] = ..., token_budget: _Optional[int] = ...) -> None: ...

class ChatFormat(_message.Message):
    __slots__ = ("prompt_prefix", "user_prefix", "user_suffix", "assistant_prefix", "eos_text", "eos_token_ids")
    PROMPT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    USER_PREFIX_FIELD_NUMBER: _ClassVar[int]
    USER_SUFFIX_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    EOS_TEXT_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    prompt_prefix: str
    user_prefix: str
    user_suffix: str
    assistant_prefix: str
    eos_text: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_prefix: _Optional[str] = ..., user_prefix: _Optional[str] = ..., user_suffix: _Optional[str] = ..., assistant_prefix: _Optional[str] = ..., eos_text: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("stats",)
    STATS_FIELD_NUMBER: _ClassVar[int]
    stats: EngineStats
    def __init__(self, stats: _Optional[_Union[EngineStats, _Mapping]] = ...) -> None: ...

class EngineStats(_message.Message):
    __slots__ = ("pools", "num_running", "num_waiting", "num_swapped", "policy", "token_budget", "model", "counters", "throughput_tokens_per_s", "generation_tokens_per_s", "max_concurrent_streams", "num_active", "num_sessions", "role")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_SWAPPED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_STREAMS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    NUM_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[BlockPoolStats]
    num_running: int
    num_waiting: int
    num_swapped: int
    policy: str
    token_budget: int
    model: str
    counters: EngineCounters
    throughput_tokens_per_s: float
    generation_tokens_per_s: float
    max_concurrent_streams: int
    num_active: int
    num_sessions: int
    role: str
    def __init__(self, pools: _Optional[_Iterable[_Union[BlockPoolStats, _Mapping]]] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_swapped: _Optional[int] = ..., policy: _Optional[str] = ..., token_budget: _Optional[int] = ..., model: _Optional[str] = ..., counters: _Optional[_Union[EngineCounters, _Mapping]] = ..., throughput_tokens_per_s: _Optional[float] = ..., generation_tokens_per_s: _Optional[float] = ..., max_concurrent_streams: _Optional[int] = ..., num_active: _Optional[int] = ..., num_sessions: _Optional[int] = ..., role: _Optional[str] = ...) -> None: ...

class BlockPoolStats(_message.Message):
    __slots__ = ("name", "total_blocks", "free_blocks", "block_size", "bytes_per_block")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    name: str
    total_blocks: int
    free_blocks: int
    block_size: int
    bytes_per_block: int
    def __init__(self, name: _Optional[str] = ..., total_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., bytes_per_block: _Optional[int] = ...) -> None: ...

class EngineCounters(_message.Message):
    __slots__ = ("requests_received", "requests_finished", "requests_aborted", "prompt_tokens_computed", "generated_tokens", "tokens_invalidated", "preemptions_swap", "preemptions_recompute", "prefix_cache_hit_tokens", "steps", "draft_tokens", "accepted_draft_tokens", "chunk_captures_skipped")
    REQUESTS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ABORTED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_COMPUTED_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_SWAP_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_RECOMPUTE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CAPTURES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    requests_received: int
    requests_finished: int
    requests_aborted: int
    prompt_tokens_computed: int
    generated_tokens: int
    tokens_invalidated: int
    preemptions_swap: int
    preemptions_recompute: int
    prefix_cache_hit_tokens: int
    steps: int
    draft_tokens: int
    accepted_draft_tokens: int
    chunk_captures_skipped: int
    def __init__(self, requests_received: _Optional[int] = ..., requests_finished: _Optional[int] = ..., requests_aborted: _Optional[int] = ..., prompt_tokens_computed: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., tokens_invalidated: _Optional[int] = ..., preemptions_swap: _Optional[int] = ..., preemptions_recompute: _Optional[int] = ..., prefix_cache_hit_tokens: _Optional[int] = ..., steps: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_draft_tokens: _Optional[int] = ..., chunk_captures_skipped: _Optional[int] = ...) -> None: ...
