from protos import common_pb2 as _common_pb2
from protos import retriever_pb2 as _retriever_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RetrieverChoice(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETRIEVER_CHOICE_UNSPECIFIED: _ClassVar[RetrieverChoice]
    RETRIEVER_CHOICE_ANNS: _ClassVar[RetrieverChoice]
    RETRIEVER_CHOICE_CRAWLER: _ClassVar[RetrieverChoice]
    RETRIEVER_CHOICE_BOTH: _ClassVar[RetrieverChoice]
    RETRIEVER_CHOICE_NONE: _ClassVar[RetrieverChoice]
    RETRIEVER_CHOICE_REPLAY: _ClassVar[RetrieverChoice]

class RequestState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_STATE_UNSPECIFIED: _ClassVar[RequestState]
    REQUEST_STATE_RECEIVED: _ClassVar[RequestState]
    REQUEST_STATE_RETRIEVING: _ClassVar[RequestState]
    REQUEST_STATE_GENERATING: _ClassVar[RequestState]
    REQUEST_STATE_FINISHED: _ClassVar[RequestState]
    REQUEST_STATE_FAILED: _ClassVar[RequestState]
    REQUEST_STATE_CANCELLED: _ClassVar[RequestState]
RETRIEVER_CHOICE_UNSPECIFIED: RetrieverChoice
RETRIEVER_CHOICE_ANNS: RetrieverChoice
RETRIEVER_CHOICE_CRAWLER: RetrieverChoice
RETRIEVER_CHOICE_BOTH: RetrieverChoice
RETRIEVER_CHOICE_NONE: RetrieverChoice
RETRIEVER_CHOICE_REPLAY: RetrieverChoice
REQUEST_STATE_UNSPECIFIED: RequestState
REQUEST_STATE_RECEIVED: RequestState
REQUEST_STATE_RETRIEVING: RequestState
REQUEST_STATE_GENERATING: RequestState
REQUEST_STATE_FINISHED: RequestState
REQUEST_STATE_FAILED: RequestState
REQUEST_STATE_CANCELLED: RequestState

class AskRequest(_message.Message):
    __slots__ = ("question", "retriever", "no_stream", "max_tokens", "sampling", "policy_hint", "top_k", "retrieval_deadline_ms", "request_id", "retriever_options", "collection", "resume")
    class RetrieverOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    RETRIEVER_FIELD_NUMBER: _ClassVar[int]
    NO_STREAM_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    POLICY_HINT_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RETRIEVER_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    question: str
    retriever: RetrieverChoice
    no_stream: bool
    max_tokens: int
    sampling: _common_pb2.SamplingParams
    policy_hint: str
    top_k: int
    retrieval_deadline_ms: int
    request_id: str
    retriever_options: _containers.ScalarMap[str, str]
    collection: str
    resume: AskResume
    def __init__(self, question: _Optional[str] = ..., retriever: _Optional[_Union[RetrieverChoice, str]] = ..., no_stream: _Optional[bool] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., policy_hint: _Optional[str] = ..., top_k: _Optional[int] = ..., retrieval_deadline_ms: _Optional[int] = ..., request_id: _Optional[str] = ..., retriever_options: _Optional[_Mapping[str, str]] = ..., collection: _Optional[str] = ..., resume: _Optional[_Union[AskResume, _Mapping]] = ...) -> None: ...

class AskResume(_message.Message):
    __slots__ = ("token_ids", "text", "attempt")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    attempt: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class AskPrompt(_message.Message):
    __slots__ = ("segments", "sampling", "sources", "retrieval_s")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_S_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.Segment]
    sampling: _common_pb2.SamplingParams
    sources: _containers.RepeatedCompositeFieldContainer[_common_pb2.Document]
    retrieval_s: float
    def __init__(self, segments: _Optional[_Iterable[_Union[_common_pb2.Segment, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., sources: _Optional[_Iterable[_Union[_common_pb2.Document, _Mapping]]] = ..., retrieval_s: _Optional[float] = ...) -> None: ...

class AskResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: AskEvent
    def __init__(self, event: _Optional[_Union[AskEvent, _Mapping]] = ...) -> None: ...

class AskEvent(_message.Message):
    __slots__ = ("started", "retrieval", "lifecycle", "token", "done", "warning")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    started: AskStarted
    retrieval: RetrievalProgress
    lifecycle: _common_pb2.LifecycleEvent
    token: _common_pb2.GeneratedToken
    done: AskDone
    warning: str
    def __init__(self, started: _Optional[_Union[AskStarted, _Mapping]] = ..., retrieval: _Optional[_Union[RetrievalProgress, _Mapping]] = ..., lifecycle: _Optional[_Union[_common_pb2.LifecycleEvent, _Mapping]] = ..., token: _Optional[_Union[_common_pb2.GeneratedToken, _Mapping]] = ..., done: _Optional[_Union[AskDone, _Mapping]] = ..., warning: _Optional[str] = ...) -> None: ...

class AskStarted(_message.Message):
    __slots__ = ("request_id", "replica", "retriever", "streamed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    RETRIEVER_FIELD_NUMBER: _ClassVar[int]
    STREAMED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    replica: str
    retriever: RetrieverChoice
    streamed: bool
    def __init__(self, request_id: _Optional[str] = ..., replica: _Optional[str] = ..., retriever: _Optional[_Union[RetrieverChoice, str]] = ..., streamed: _Optional[bool] = ...) -> None: ...

class RetrievalProgress(_message.Message):
    __slots__ = ("seq", "mode", "documents", "num_documents", "final", "source", "elapsed_s")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NUM_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    seq: int
    mode: _retriever_pb2.ChunkMode
    documents: _containers.RepeatedCompositeFieldContainer[_common_pb2.Document]
    num_documents: int
    final: bool
    source: str
    elapsed_s: float
    def __init__(self, seq: _Optional[int] = ..., mode: _Optional[_Union[_retriever_pb2.ChunkMode, str]] = ..., documents: _Optional[_Iterable[_Union[_common_pb2.Document, _Mapping]]] = ..., num_documents: _Optional[int] = ..., final: _Optional[bool] = ..., source: _Optional[str] = ..., elapsed_s: _Optional[float] = ...) -> None: ...

class AskDone(_message.Message):
    __slots__ = ("answer", "sources", "ttft_from_question_s", "ttft_from_retrieval_end_s", "request_id", "stats", "finish_reason", "replica", "retrieval_s", "total_s", "warnings")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    TTFT_FROM_QUESTION_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_FROM_RETRIEVAL_END_S_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    answer: str
    sources: _containers.RepeatedCompositeFieldContainer[_common_pb2.Document]
    ttft_from_question_s: float
    ttft_from_retrieval_end_s: float
    request_id: str
    stats: _common_pb2.RequestStats
    finish_reason: _common_pb2.FinishReason
    replica: str
    retrieval_s: float
    total_s: float
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, answer: _Optional[str] = ..., sources: _Optional[_Iterable[_Union[_common_pb2.Document, _Mapping]]] = ..., ttft_from_question_s: _Optional[float] = ..., ttft_from_retrieval_end_s: _Optional[float] = ..., request_id: _Optional[str] = ..., stats: _Optional[_Union[_common_pb2.RequestStats, _Mapping]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., replica: _Optional[str] = ..., retrieval_s: _Optional[float] = ..., total_s: _Optional[float] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class GetRequestRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class GetRequestResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: RequestRecord
    def __init__(self, record: _Optional[_Union[RequestRecord, _Mapping]] = ...) -> None: ...

class ListRequestsRequest(_message.Message):
    __slots__ = ("limit", "tenant")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    tenant: str
    def __init__(self, limit: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class ListRequestsResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[RequestRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[RequestRecord, _Mapping]]] = ...) -> None: ...

class RequestRecord(_message.Message):
    __slots__ = ("request_id", "question", "state", "replica", "retriever", "streamed", "created_unix_ms", "updated_unix_ms", "stats", "events", "answer", "ttft_from_question_s", "ttft_from_retrieval_end_s", "error", "tenant", "priority")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    RETRIEVER_FIELD_NUMBER: _ClassVar[int]
    STREAMED_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    TTFT_FROM_QUESTION_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_FROM_RETRIEVAL_END_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    question: str
    state: RequestState
    replica: str
    retriever: RetrieverChoice
    streamed: bool
    created_unix_ms: int
    updated_unix_ms: int
    stats: _common_pb2.RequestStats
    events: _containers.RepeatedCompositeFieldContainer[RecordedEvent]
    answer: str
    ttft_from_question_s: float
    ttft_from_retrieval_end_s: float
    error: str
    tenant: str
    priority: int
    def __init__(self, request_id: _Optional[str] = ..., question: _Optional[str] = ..., state: _Optional[_Union[RequestState, str]] = ..., replica: _Optional[str] = ..., retriever: _Optional[_Union[RetrieverChoice, str]] = ..., streamed: _Optional[bool] = ..., created_unix_ms: _Optional[int] = ..., updated_unix_ms: _Optional[int] = ..., stats: _Optional[_Union[_common_pb2.RequestStats, _Mapping]] = ..., events: _Optional[_Iterable[_Union[RecordedEvent, _Mapping]]] = ..., answer: _Optional[str] = ..., ttft_from_question_s: _Optional[float] = ..., ttft_from_retrieval_end_s: _Optional[float] = ..., error: _Optional[str] = ..., tenant: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class RecordedEvent(_message.Message):
    __slots__ = ("stream_id", "kind", "unix_ms", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    kind: str
    unix_ms: int
    fields: _containers.ScalarMap[str, str]
    def __init__(self, stream_id: _Optional[str] = ..., kind: _Optional[str] = ..., unix_ms: _Optional[int] = ..., fields: _Optional[_Mapping[str, str]] = ...) -> None: ...
