"""Each replica's chat format (its `Describe`), asked once per replica and kept: an Ask builds its
prompt from it, and a continuation reads the model's end-of-sequence ids in it (keeper.py)."""

from __future__ import annotations

from protos import inference_pb2

DESCRIBE_TIMEOUT_S = 10.0


class ChatFormats:
    def __init__(self) -> None:
        self._formats: dict[str, inference_pb2.ChatFormat] = {}

    async def __call__(self, replica) -> inference_pb2.ChatFormat:
        """The replica's chat-format pieces; a failed Describe raises its `grpc.RpcError`."""
        if replica.address not in self._formats:
            info = await replica.stub.Describe(inference_pb2.DescribeRequest(), timeout=DESCRIBE_TIMEOUT_S)
            self._formats[replica.address] = info.model_info.chat_format
        return self._formats[replica.address]
