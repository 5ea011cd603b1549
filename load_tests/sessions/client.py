"""The calls `bench sessions` makes, over one channel to the inference service, each timed from
sending to the first token as a client sees it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BATCH_SEGMENTS = 4              # segments per ingest batch (one data version)


@dataclass
class QueryResult:
    ttft_ms: float             # client: sent -> first token (a Flash hit: -> the answer)
    server_ttft_ms: float      # QueryDone.ttft_ms
    context_tokens: int
    shared_tokens: int
    data_version: int
    flash_hit: bool
    tokens_computed: int


class SessionsClient:
    """The calls the benchmark makes, over one channel to the service."""

    def __init__(self, address: str) -> None:
        import grpc

        from protos import inference_pb2, inference_pb2_grpc, sessions_pb2_grpc

        self.channel = grpc.insecure_channel(address)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.sessions = sessions_pb2_grpc.SessionsStub(self.channel)
        chat = self.inference.Describe(inference_pb2.DescribeRequest(), timeout=60).model_info.chat_format
        self.head_prefix = chat.prompt_prefix + chat.user_prefix
        self.query_suffix = chat.user_suffix + chat.assistant_prefix

    def close(self) -> None:
        self.channel.close()

    # the prompt, as sessions.proto lays it out
    def segments(self, instructions: str, data: Sequence[str], question: str) -> list[Any]:
        from inference_svc.native.sessions import DATA_HEADER
        from protos import common_pb2

        return [common_pb2.Segment(text=self.head_prefix + instructions + DATA_HEADER),
                *(common_pb2.Segment(text=text) for text in data),
                common_pb2.Segment(text=f"Question: {question}" + self.query_suffix)]

    def query(self, session_id: str, question: str, max_tokens: int = 1) -> QueryResult:
        from protos import common_pb2, sessions_pb2

        request = sessions_pb2.QueryRequest(session_id=session_id, question=question,
                                            sampling=common_pb2.SamplingParams(max_tokens=max_tokens))
        sent = time.perf_counter()
        first = started = done = None
        for response in self.sessions.Query(request, timeout=600):
            kind = response.WhichOneof("kind")
            if kind == "token":
                first = first or time.perf_counter()
            elif kind == "started":
                started = response.started
            else:
                done = response.done
        end = time.perf_counter()
        return QueryResult(((first or end) - sent) * 1e3, done.ttft_ms, started.context_tokens, started.shared_tokens,
                           done.data_version, done.flash_hit, done.stats.tokens_computed)

    def generate(self, segments: Sequence[Any], max_tokens: int = 1) -> tuple[float, Any]:
        """Client TTFT (ms) and the InferenceDone."""
        from protos import common_pb2, inference_pb2

        request = inference_pb2.GenerateRequest(segments=list(segments),
                                                sampling=common_pb2.SamplingParams(max_tokens=max_tokens))
        sent = time.perf_counter()
        first = done = None
        for response in self.inference.Generate(request, timeout=600):
            kind = response.event.WhichOneof("kind")
            if kind == "token":
                first = first or time.perf_counter()
            elif kind == "done":
                done = response.event.done
        return ((first or time.perf_counter()) - sent) * 1e3, done

    def ingest(self, session_id: str, texts: Sequence[str]) -> Any:
        from protos import common_pb2, sessions_pb2

        batches = [texts[i:i + BATCH_SEGMENTS] for i in range(0, len(texts), BATCH_SEGMENTS)]
        return self.sessions.Ingest(iter([sessions_pb2.IngestRequest(
            session_id=session_id, segments=[common_pb2.Segment(text=t) for t in batch]) for batch in batches]),
            timeout=600)

    def describe(self, session_id: str) -> Any:
        from protos import sessions_pb2

        return self.sessions.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=session_id),
                                             timeout=60).session

    def wait_ready(self, session_id: str, timeout_s: float = 900.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.describe(session_id)
            if info.state == "ready" and info.computed_tokens == info.head_tokens + info.data_tokens:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"session {session_id} not ready after {timeout_s:.0f}s: {info}")
            time.sleep(0.01)
