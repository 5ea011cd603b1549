from protos import common_pb2 as _common_pb2
from protos import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransferRequest(_message.Message):
    __slots__ = ("request_id", "begin", "blocks", "truncate", "finish")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    begin: KvBegin
    blocks: KvBlocks
    truncate: KvTruncate
    finish: KvFinish
    def __init__(self, request_id: _Optional[str] = ..., begin: _Optional[_Union[KvBegin, _Mapping]] = ..., blocks: _Optional[_Union[KvBlocks, _Mapping]] = ..., truncate: _Optional[_Union[KvTruncate, _Mapping]] = ..., finish: _Optional[_Union[KvFinish, _Mapping]] = ...) -> None: ...

class KvBegin(_message.Message):
    __slots__ = ("sampling", "priority", "layout")
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    sampling: _common_pb2.SamplingParams
    priority: int
    layout: KvLayout
    def __init__(self, sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., priority: _Optional[int] = ..., layout: _Optional[_Union[KvLayout, _Mapping]] = ...) -> None: ...

class KvLayout(_message.Message):
    __slots__ = ("num_layers", "num_kv_heads", "head_dim", "block_size", "dtype")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    def __init__(self, num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., block_size: _Optional[int] = ..., dtype: _Optional[str] = ...) -> None: ...

class KvBlocks(_message.Message):
    __slots__ = ("start_token", "token_ids", "num_blocks", "data")
    START_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    start_token: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_blocks: int
    data: bytes
    def __init__(self, start_token: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_blocks: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class KvTruncate(_message.Message):
    __slots__ = ("valid_tokens",)
    VALID_TOKENS_FIELD_NUMBER: _ClassVar[int]
    valid_tokens: int
    def __init__(self, valid_tokens: _Optional[int] = ...) -> None: ...

class KvFinish(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TransferResponse(_message.Message):
    __slots__ = ("ack", "event")
    ACK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ack: KvAck
    event: _inference_pb2.InferenceEvent
    def __init__(self, ack: _Optional[_Union[KvAck, _Mapping]] = ..., event: _Optional[_Union[_inference_pb2.InferenceEvent, _Mapping]] = ...) -> None: ...

class KvAck(_message.Message):
    __slots__ = ("tokens", "imported_tokens", "finished")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    imported_tokens: int
    finished: bool
    def __init__(self, tokens: _Optional[int] = ..., imported_tokens: _Optional[int] = ..., finished: _Optional[bool] = ...) -> None: ...
