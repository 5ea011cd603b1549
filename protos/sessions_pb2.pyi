from protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateSessionRequest(_message.Message):
    __slots__ = ("session_id", "instructions", "retention_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    instructions: str
    retention_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., instructions: _Optional[str] = ..., retention_tokens: _Optional[int] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: SessionInfo
    def __init__(self, session: _Optional[_Union[SessionInfo, _Mapping]] = ...) -> None: ...

class DescribeSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DescribeSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: SessionInfo
    def __init__(self, session: _Optional[_Union[SessionInfo, _Mapping]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: SessionInfo
    def __init__(self, session: _Optional[_Union[SessionInfo, _Mapping]] = ...) -> None: ...

class IngestRequest(_message.Message):
    __slots__ = ("session_id", "segments")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.Segment]
    def __init__(self, session_id: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[_common_pb2.Segment, _Mapping]]] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("session_id", "data_version", "batches", "segments", "data_tokens", "dropped_segments")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DATA_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    data_version: int
    batches: int
    segments: int
    data_tokens: int
    dropped_segments: int
    def __init__(self, session_id: _Optional[str] = ..., data_version: _Optional[int] = ..., batches: _Optional[int] = ..., segments: _Optional[int] = ..., data_tokens: _Optional[int] = ..., dropped_segments: _Optional[int] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("session_id", "question", "sampling", "request_id", "min_data_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    question: str
    sampling: _common_pb2.SamplingParams
    request_id: str
    min_data_version: int
    def __init__(self, session_id: _Optional[str] = ..., question: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ..., min_data_version: _Optional[int] = ...) -> None: ...

class QueryResponse(_message.Message):
    __slots__ = ("started", "token", "done")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    started: QueryStarted
    token: _common_pb2.GeneratedToken
    done: QueryDone
    def __init__(self, started: _Optional[_Union[QueryStarted, _Mapping]] = ..., token: _Optional[_Union[_common_pb2.GeneratedToken, _Mapping]] = ..., done: _Optional[_Union[QueryDone, _Mapping]] = ...) -> None: ...

class QueryStarted(_message.Message):
    __slots__ = ("data_version", "flash_hit", "context_tokens", "shared_tokens", "request_id")
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    FLASH_HIT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SHARED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    data_version: int
    flash_hit: bool
    context_tokens: int
    shared_tokens: int
    request_id: str
    def __init__(self, data_version: _Optional[int] = ..., flash_hit: _Optional[bool] = ..., context_tokens: _Optional[int] = ..., shared_tokens: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class QueryDone(_message.Message):
    __slots__ = ("finish_reason", "text", "data_version", "flash_hit", "ttft_ms", "total_ms", "confidence", "stats", "finish_detail")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    FLASH_HIT_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    FINISH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    finish_reason: _common_pb2.FinishReason
    text: str
    data_version: int
    flash_hit: bool
    ttft_ms: float
    total_ms: float
    confidence: float
    stats: _common_pb2.RequestStats
    finish_detail: str
    def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., text: _Optional[str] = ..., data_version: _Optional[int] = ..., flash_hit: _Optional[bool] = ..., ttft_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., confidence: _Optional[float] = ..., stats: _Optional[_Union[_common_pb2.RequestStats, _Mapping]] = ..., finish_detail: _Optional[str] = ...) -> None: ...

class RegisterFlashQueryRequest(_message.Message):
    __slots__ = ("session_id", "question", "max_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    question: str
    max_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., question: _Optional[str] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class RegisterFlashQueryResponse(_message.Message):
    __slots__ = ("session_id", "questions")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    questions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., questions: _Optional[_Iterable[str]] = ...) -> None: ...

class UnregisterFlashQueryRequest(_message.Message):
    __slots__ = ("session_id", "question")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    question: str
    def __init__(self, session_id: _Optional[str] = ..., question: _Optional[str] = ...) -> None: ...

class UnregisterFlashQueryResponse(_message.Message):
    __slots__ = ("session_id", "questions")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    questions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., questions: _Optional[_Iterable[str]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("session_id", "replay_current")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REPLAY_CURRENT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    replay_current: bool
    def __init__(self, session_id: _Optional[str] = ..., replay_current: _Optional[bool] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: SessionEvent
    def __init__(self, event: _Optional[_Union[SessionEvent, _Mapping]] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("session_id", "data_updated", "flash_ready", "closed")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_UPDATED_FIELD_NUMBER: _ClassVar[int]
    FLASH_READY_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    data_updated: DataUpdated
    flash_ready: FlashReady
    closed: SessionClosed
    def __init__(self, session_id: _Optional[str] = ..., data_updated: _Optional[_Union[DataUpdated, _Mapping]] = ..., flash_ready: _Optional[_Union[FlashReady, _Mapping]] = ..., closed: _Optional[_Union[SessionClosed, _Mapping]] = ...) -> None: ...

class DataUpdated(_message.Message):
    __slots__ = ("data_version", "data_tokens", "dropped_segments")
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    data_version: int
    data_tokens: int
    dropped_segments: int
    def __init__(self, data_version: _Optional[int] = ..., data_tokens: _Optional[int] = ..., dropped_segments: _Optional[int] = ...) -> None: ...

class FlashReady(_message.Message):
    __slots__ = ("question", "answer", "confidence", "data_version", "eval_ms")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    EVAL_MS_FIELD_NUMBER: _ClassVar[int]
    question: str
    answer: str
    confidence: float
    data_version: int
    eval_ms: float
    def __init__(self, question: _Optional[str] = ..., answer: _Optional[str] = ..., confidence: _Optional[float] = ..., data_version: _Optional[int] = ..., eval_ms: _Optional[float] = ...) -> None: ...

class SessionClosed(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "data_version", "head_tokens", "data_tokens", "computed_tokens", "retention_tokens", "segments", "dropped_segments", "flash_questions", "state", "active_queries", "replica", "instructions")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    HEAD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DATA_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    FLASH_QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    data_version: int
    head_tokens: int
    data_tokens: int
    computed_tokens: int
    retention_tokens: int
    segments: int
    dropped_segments: int
    flash_questions: _containers.RepeatedScalarFieldContainer[str]
    state: str
    active_queries: int
    replica: str
    instructions: str
    def __init__(self, session_id: _Optional[str] = ..., data_version: _Optional[int] = ..., head_tokens: _Optional[int] = ..., data_tokens: _Optional[int] = ..., computed_tokens: _Optional[int] = ..., retention_tokens: _Optional[int] = ..., segments: _Optional[int] = ..., dropped_segments: _Optional[int] = ..., flash_questions: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., active_queries: _Optional[int] = ..., replica: _Optional[str] = ..., instructions: _Optional[str] = ...) -> None: ...
