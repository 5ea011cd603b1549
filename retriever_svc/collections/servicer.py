"""The `Collections` gRPC servicer: a thin translation onto the registry, plus the background merger.

Writes go one at a time per process (a file is embedded, committed, then published), in a
worker thread, so searches keep being served. Each AddFiles answer is sent only after the
file's passages are committed and searchable: an answered file survives a SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

import grpc

from protos import retriever_pb2, retriever_pb2_grpc
from retriever_svc.collections.collection import Added, AddResult
from retriever_svc.collections.registry import CollectionRegistry
from retriever_svc.service import RetrieverError, error_message, status_for

log = logging.getLogger(__name__)
MERGE_CHECK_S = 5.0
STATUS = {Added.ADDED: retriever_pb2.ADD_FILE_STATUS_ADDED, Added.REPLACED: retriever_pb2.ADD_FILE_STATUS_REPLACED,
          Added.UNCHANGED: retriever_pb2.ADD_FILE_STATUS_UNCHANGED, Added.FAILED: retriever_pb2.ADD_FILE_STATUS_FAILED}


def collection_info(info: dict) -> retriever_pb2.CollectionInfo:
    return retriever_pb2.CollectionInfo(**info)


class CollectionsServicer(retriever_pb2_grpc.CollectionsServicer):
    def __init__(self, backend) -> None:
        """`backend`: the `anns.AnnsBackend` whose collections these are (and whose embedder they share)."""
        self.backend = backend
        self.registry: CollectionRegistry = backend.collections
        self._write_lock = threading.Lock()
        self._count_tokens = None

    def count_tokens(self, text: str) -> int:
        if self._count_tokens is None:
            from retriever_svc.corpus.index import token_counter

            self._count_tokens = token_counter()
        with self.backend.embed_lock:
            return self._count_tokens(text)

    async def _call(self, context, function, *args):
        """Run `function(*args)` in a worker thread; a retriever error becomes its status."""
        try:
            return await asyncio.to_thread(function, *args)
        except RetrieverError as exc:
            await context.abort(status_for(exc), error_message(exc))

    async def ListCollections(self, request, context) -> retriever_pb2.ListCollectionsResponse:
        infos = await self._call(context, self.registry.infos)
        return retriever_pb2.ListCollectionsResponse(collections=[collection_info(i) for i in infos])

    async def CreateCollection(self, request, context) -> retriever_pb2.CreateCollectionResponse:
        collection = await self._call(context, self.registry.create, request.name)
        return retriever_pb2.CreateCollectionResponse(collection=collection_info({**collection.info(),
                                                                                  "is_default": False}))

    async def DropCollection(self, request, context) -> retriever_pb2.DropCollectionResponse:
        info = await self._call(context, self._locked, self.registry.drop, request.name)
        return retriever_pb2.DropCollectionResponse(dropped=collection_info(info))

    async def AddFiles(self, request_iterator, context) -> AsyncIterator[retriever_pb2.AddFilesResponse]:
        async for request in request_iterator:
            if not request.path:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "each file needs a path")
            collection = await self._call(context, self.registry.live, request.collection)
            result: AddResult = await self._call(context, self._locked, collection.add_file, request.path,
                                                 request.content, self.count_tokens, self.backend.embed_passages)
            yield retriever_pb2.AddFilesResponse(path=result.path, status=STATUS[result.status],
                                                 passages=result.passages, message=result.message,
                                                 seconds=result.seconds)

    async def RemoveFiles(self, request, context) -> retriever_pb2.RemoveFilesResponse:
        if not request.paths or not all(path.strip("/") for path in request.paths):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "name the files or folders to remove (an empty path or / would remove everything)")
        collection = await self._call(context, self.registry.live, request.collection)
        removed, passages = await self._call(context, self._locked, collection.remove, list(request.paths))
        return retriever_pb2.RemoveFilesResponse(removed=removed, passages=passages)

    async def MergeCollection(self, request, context) -> retriever_pb2.MergeCollectionResponse:
        collection = await self._call(context, self.registry.live, request.name)
        await asyncio.to_thread(collection.index.merge)
        return retriever_pb2.MergeCollectionResponse(collection=collection_info({**collection.info(),
                                                                                 "is_default": False}))

    def _locked(self, function, *args):
        with self._write_lock:
            return function(*args)

    async def merge_in_background(self, interval_s: float = MERGE_CHECK_S) -> None:
        """Merge each collection whose memory part or delete marks have grown past the thresholds."""
        while True:
            await asyncio.sleep(interval_s)
            for collection in self.registry.collections():
                if collection.index.needs_merge():
                    log.info("merging collection %s", collection.name)
                    try:
                        await asyncio.to_thread(collection.index.merge, 1, False)
                    except Exception:                   # the old generation keeps serving; retried next round
                        log.exception("merging collection %s failed", collection.name)
