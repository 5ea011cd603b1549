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

class AddFileStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADD_FILE_STATUS_UNSPECIFIED: _ClassVar[AddFileStatus]
    ADD_FILE_STATUS_ADDED: _ClassVar[AddFileStatus]
    ADD_FILE_STATUS_REPLACED: _ClassVar[AddFileStatus]
    ADD_FILE_STATUS_UNCHANGED: _ClassVar[AddFileStatus]
    ADD_FILE_STATUS_FAILED: _ClassVar[AddFileStatus]
CHUNK_MODE_UNSPECIFIED: ChunkMode
CHUNK_MODE_APPEND: ChunkMode
CHUNK_MODE_UPDATE: ChunkMode
RETRIEVER_KIND_UNSPECIFIED: RetrieverKind
RETRIEVER_KIND_ANNS: RetrieverKind
RETRIEVER_KIND_CRAWLER: RetrieverKind
RETRIEVER_KIND_REPLAY: RetrieverKind
ADD_FILE_STATUS_UNSPECIFIED: AddFileStatus
ADD_FILE_STATUS_ADDED: AddFileStatus
ADD_FILE_STATUS_REPLACED: AddFileStatus
ADD_FILE_STATUS_UNCHANGED: AddFileStatus
ADD_FILE_STATUS_FAILED: AddFileStatus

class RetrieveRequest(_message.Message):
    __slots__ = ("query", "top_k", "deadline_ms", "options", "request_id", "collection")
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
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    query: str
    top_k: int
    deadline_ms: int
    options: _containers.ScalarMap[str, str]
    request_id: str
    collection: str
    def __init__(self, query: _Optional[str] = ..., top_k: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ..., collection: _Optional[str] = ...) -> None: ...

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

class ListCollectionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCollectionsResponse(_message.Message):
    __slots__ = ("collections",)
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    collections: _containers.RepeatedCompositeFieldContainer[CollectionInfo]
    def __init__(self, collections: _Optional[_Iterable[_Union[CollectionInfo, _Mapping]]] = ...) -> None: ...

class CollectionInfo(_message.Message):
    __slots__ = ("name", "files", "passages", "disk_passages", "memory_passages", "deleted_passages", "read_only", "state", "progress", "is_default")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    DISK_PASSAGES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PASSAGES_FIELD_NUMBER: _ClassVar[int]
    DELETED_PASSAGES_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    name: str
    files: int
    passages: int
    disk_passages: int
    memory_passages: int
    deleted_passages: int
    read_only: bool
    state: str
    progress: str
    is_default: bool
    def __init__(self, name: _Optional[str] = ..., files: _Optional[int] = ..., passages: _Optional[int] = ..., disk_passages: _Optional[int] = ..., memory_passages: _Optional[int] = ..., deleted_passages: _Optional[int] = ..., read_only: _Optional[bool] = ..., state: _Optional[str] = ..., progress: _Optional[str] = ..., is_default: _Optional[bool] = ...) -> None: ...

class CreateCollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CreateCollectionResponse(_message.Message):
    __slots__ = ("collection",)
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    collection: CollectionInfo
    def __init__(self, collection: _Optional[_Union[CollectionInfo, _Mapping]] = ...) -> None: ...

class DropCollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DropCollectionResponse(_message.Message):
    __slots__ = ("dropped",)
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    dropped: CollectionInfo
    def __init__(self, dropped: _Optional[_Union[CollectionInfo, _Mapping]] = ...) -> None: ...

class AddFilesRequest(_message.Message):
    __slots__ = ("collection", "path", "content")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    collection: str
    path: str
    content: bytes
    def __init__(self, collection: _Optional[str] = ..., path: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class AddFilesResponse(_message.Message):
    __slots__ = ("path", "status", "passages", "message", "seconds")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    path: str
    status: AddFileStatus
    passages: int
    message: str
    seconds: float
    def __init__(self, path: _Optional[str] = ..., status: _Optional[_Union[AddFileStatus, str]] = ..., passages: _Optional[int] = ..., message: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class RemoveFilesRequest(_message.Message):
    __slots__ = ("collection", "paths")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, collection: _Optional[str] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveFilesResponse(_message.Message):
    __slots__ = ("removed", "passages")
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    removed: _containers.RepeatedScalarFieldContainer[str]
    passages: int
    def __init__(self, removed: _Optional[_Iterable[str]] = ..., passages: _Optional[int] = ...) -> None: ...

class MergeCollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class MergeCollectionResponse(_message.Message):
    __slots__ = ("collection",)
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    collection: CollectionInfo
    def __init__(self, collection: _Optional[_Union[CollectionInfo, _Mapping]] = ...) -> None: ...
