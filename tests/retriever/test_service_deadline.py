"""The Retrieve deadline, through a real gRPC server on loopback, with a slow reader.

The backend is a stand-in at the `RetrieverBackend` seam (the crawler, ANNS and replay tests
drive the real ones): it yields large chunks without pause, so the server spends its time
blocked writing while the client does not read. The deadline must still end the call with a
final chunk, whether it passes while the server waits for the backend or while it writes.
"""

from __future__ import annotations

import asyncio

import grpc

from protos import common_pb2, retriever_pb2
from retriever_svc.service import RetrievalQuery
from tests.support.retrievers import serving_retriever

PAGE = "x" * (256 * 1024)


class EndlessBackend:
    kind = retriever_pb2.RETRIEVER_KIND_CRAWLER
    has_collections = False
    options: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def retrieve(self, query: RetrievalQuery):
        try:
            n = 0
            while True:
                n += 1
                yield retriever_pb2.ContextChunk(mode=retriever_pb2.CHUNK_MODE_APPEND, documents=[
                    common_pb2.Document(id=f"d{n}", text=PAGE)])
                await asyncio.sleep(0)
        finally:
            self.closed.set()

    def describe(self) -> retriever_pb2.RetrieverInfo:
        return retriever_pb2.RetrieverInfo(kind=self.kind, corpus="endless")


async def test_a_deadline_that_passes_while_the_server_writes_still_ends_the_call_with_a_final_chunk() -> None:
    backend = EndlessBackend()
    async with serving_retriever(backend, "endless") as served:
        call = served.retriever.Retrieve(retriever_pb2.RetrieveRequest(query="anything", top_k=100, deadline_ms=300))
        await asyncio.sleep(1.5)   # read nothing past the deadline: the server is stuck in a write
        chunks = [response.chunk async for response in call]
        assert await call.code() == grpc.StatusCode.OK
        assert chunks[-1].final and not chunks[-1].documents
        assert [c.seq for c in chunks] == list(range(len(chunks)))
        assert not any(c.final for c in chunks[:-1])
        await asyncio.wait_for(backend.closed.wait(), 10)
