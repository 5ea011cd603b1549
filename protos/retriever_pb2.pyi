from protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNK_MODE_UNSPECIFIED: _ClassVar[ChunkMode]
    CHUNK_MODE_APPEND: _ClassVar[ChunkMode]
    CHUNK_MODE_UPDATE: _ClassVar[ChunkMode]

class RetrieverKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETRIEVER_KIND_UNSPECIFIED: _ClassVar[RetrieverKind]
    RETRIEVER_KIND_ANNS: _ClassVar[RetrieverKind]
    RETRIEVER_KIND_CRAWLER: _ClassVar[RetrieverKind]
    RETRIEVER_KIND_REPLAY: _ClassVar[RetrieverKind]
CHUNK_MODE_UNSPECIFIED: ChunkMode
CHUNK_MODE_APPEND: ChunkMode
CHUNK_MODE_UPDATE: ChunkMode
RETRIEVER_KIND_UNSPECIFIED: RetrieverKind
RETRIEVER_KIND_ANNS: RetrieverKind
RETRIEVER_KIND_CRAWLER: RetrieverKind
RETRIEVER_KIND_REPLAY: RetrieverKind

class RetrieveRequest(_message.Message):
    __slots__ = ("query", "top_k", "deadline_ms", "options", "request_id")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    query: str
    top_k: int
    deadline_ms: int
    options: _containers.ScalarMap[str, str]
    request_id: str
    def __init__(self, query: _Optional[str] = ..., top_k: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RetrieveResponse(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: ContextChunk
    def __init__(self, chunk: _Optional[_Union[ContextChunk, _Mapping]] = ...) -> None: ...

class ContextChunk(_message.Message):
    __slots__ = ("seq", "mode", "documents", "final", "emitted_unix_ms", "stage")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    EMITTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    mode: ChunkMode
    documents: _containers.RepeatedCompositeFieldContainer[_common_pb2.Document]
    final: bool
    emitted_unix_ms: int
    stage: StageInfo
    def __init__(self, seq: _Optional[int] = ..., mode: _Optional[_Union[ChunkMode, str]] = ..., documents: _Optional[_Iterable[_Union[_common_pb2.Document, _Mapping]]] = ..., final: _Optional[bool] = ..., emitted_unix_ms: _Optional[int] = ..., stage: _Optional[_Union[StageInfo, _Mapping]] = ...) -> None: ...

class StageInfo(_message.Message):
    __slots__ = ("index", "search_list_size", "recall_at_k")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SEARCH_LIST_SIZE_FIELD_NUMBER: _ClassVar[int]
    RECALL_AT_K_FIELD_NUMBER: _ClassVar[int]
    index: int
    search_list_size: int
    recall_at_k: float
    def __init__(self, index: _Optional[int] = ..., search_list_size: _Optional[int] = ..., recall_at_k: _Optional[float] = ...) -> None: ...

class RetrieverDescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RetrieverDescribeResponse(_message.Message):
    __slots__ = ("retriever_info",)
    RETRIEVER_INFO_FIELD_NUMBER: _ClassVar[int]
    retriever_info: RetrieverInfo
    def __init__(self, retriever_info: _Optional[_Union[RetrieverInfo, _Mapping]] = ...) -> None: ...

class RetrieverInfo(_message.Message):
    __slots__ = ("kind", "corpus", "num_documents", "facts")
    class FactsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    CORPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    kind: RetrieverKind
    corpus: str
    num_documents: int
    facts: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[_Union[RetrieverKind, str]] = ..., corpus: _Optional[str] = ..., num_documents: _Optional[int] = ..., facts: _Optional[_Mapping[str, str]] = ...) -> None: ...
