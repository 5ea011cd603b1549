"""The ANNS retriever on Milvus, against the embedded Milvus server (opt-in: --run-milvus; it starts and restarts a
real server, about 20 s each, and Milvus builds its index in the background).

The same gRPC contract as the diskannpy backend: staged early results as UPDATE chunks, the
collections service, files added and removed, clear errors for bad input and for a Milvus that
is down, and no acknowledged file lost when Milvus is killed and started again.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

pytestmark = pytest.mark.milvus
pytest.importorskip("milvus")
pytest.importorskip("pymilvus")

from protos import retriever_pb2 as pb  # noqa: E402
from retriever_svc.collections.registry import CollectionRegistry, DefaultCollection  # noqa: E402
from retriever_svc.milvus.backend import MilvusAnnsBackend  # noqa: E402
from retriever_svc.milvus.bundled import MilvusBundledIndex  # noqa: E402
from retriever_svc.milvus.connection import MilvusConnection, MilvusSettings  # noqa: E402
from retriever_svc.milvus.embedded import EmbeddedMilvus  # noqa: E402
from retriever_svc.milvus.live import MilvusLiveIndex  # noqa: E402
from tests.retriever import build_tiny_index  # noqa: E402
from tests.retriever.collections_support import (  # noqa: E402
    ADDED,
    FERRIES,
    MARMALADE,
    QUESTIONS,
    ZORBLAX,
    add_files,
    documents,
    failure,
    from_file,
    infos,
    write,
)
from tests.support.retrievers import serving_retriever  # noqa: E402

SCHEDULE = (4, 16, 64)


@pytest.fixture(scope="module")
def milvus(tmp_path_factory):
    server = EmbeddedMilvus(tmp_path_factory.mktemp("milvus"), 19730).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory) -> Path:
    return build_tiny_index(tmp_path_factory.mktemp("milvus-tiny"))


@asynccontextmanager
async def serving(milvus: EmbeddedMilvus, tiny_index: Path, root: Path, timeout_s: float = 10.0):
    connection = MilvusConnection(MilvusSettings(milvus.uri, timeout_s=timeout_s)).connect()
    registry = CollectionRegistry(root, DefaultCollection(MilvusBundledIndex(tiny_index, connection)),
                                  index_factory=lambda folder, store: MilvusLiveIndex(folder, store, connection))
    backend = MilvusAnnsBackend(registry, connection, schedule=SCHEDULE, beam_width=4)
    try:
        async with serving_retriever(backend, "anns") as stubs:
            yield stubs, registry
    finally:
        registry.close()
        connection.close()


async def test_early_results_collections_add_and_remove_on_milvus(milvus, tiny_index, tmp_path):
    from pymilvus import utility

    async with serving(milvus, tiny_index, tmp_path / "collections") as (stubs, registry):
        # The default collection, from Milvus: staged UPDATE chunks, growing L, the last one final and exact.
        request = pb.RetrieveRequest(query="How do lists work?", top_k=3, options={"measure_recall": "true"})
        chunks = [r.chunk async for r in stubs.retriever.Retrieve(request)]
        assert chunks and all(c.mode == pb.CHUNK_MODE_UPDATE for c in chunks) and chunks[-1].final
        sizes = [c.stage.search_list_size for c in chunks]
        assert sizes == sorted(sizes) and sizes[-1] == SCHEDULE[-1]
        assert chunks[-1].stage.recall_at_k == 1.0 and chunks[-1].documents[0].url == "lists.html"
        info = (await stubs.retriever.Describe(pb.RetrieverDescribeRequest())).retriever_info
        assert info.facts["backend"] == "milvus" and info.facts["milvus_index"] == "HNSW"

        await stubs.collections.CreateCollection(pb.CreateCollectionRequest(name="my-notes"))
        name = registry.live("my-notes").index.milvus.name
        assert utility.has_collection(name, using=registry.live("my-notes").index.milvus.connection.alias)
        files = [write(tmp_path / "docs" / "zorblax.md", ZORBLAX), write(tmp_path / "docs" / "ferries.rst", FERRIES),
                 write(tmp_path / "docs" / "notes" / "marmalade.txt", MARMALADE)]
        assert [r.status for r in await add_files(stubs, "my-notes", files)] == [ADDED] * 3
        for path, _ in files:                   # searchable as soon as answered
            question = QUESTIONS[Path(path).relative_to(tmp_path / "docs").as_posix()]
            found = await documents(stubs, question, "my-notes", top_k=1)
            assert from_file(found[0], path), (question, found[0].url)
        assert (await infos(stubs))["my-notes"].passages == 3

        removed = await stubs.collections.RemoveFiles(pb.RemoveFilesRequest(collection="my-notes",
                                                                             paths=[str(tmp_path / "docs" / "notes")]))
        assert list(removed.removed) == [files[2][0]]
        found = await documents(stubs, QUESTIONS["notes/marmalade.txt"], "my-notes")
        assert [d.url for d in found if from_file(d, files[2][0])] == [] and len(found) == 2
        merged = (await stubs.collections.MergeCollection(pb.MergeCollectionRequest(name="my-notes"))).collection
        assert merged.memory_passages == 0 and merged.passages == 2

        # Bad input: the same refusals as the diskannpy backend.
        bad = [pb.RetrieveRequest(query="lists", options={"l_schedule": "64,4"}),
               pb.RetrieveRequest(query="lists", options={"search_list": "8"}),
               pb.RetrieveRequest(query="", collection="my-notes"),
               pb.RetrieveRequest(query="lists", collection="bad name")]
        for request in bad:
            assert (await failure(stubs.retriever.Retrieve(request))).code() == grpc.StatusCode.INVALID_ARGUMENT
        error = await failure(stubs.retriever.Retrieve(pb.RetrieveRequest(query="lists", collection="nope")))
        assert error.code() == grpc.StatusCode.NOT_FOUND

        await stubs.collections.DropCollection(pb.DropCollectionRequest(name="my-notes"))
        assert not utility.has_collection(name, using=registry.default.ready().milvus.connection.alias)


async def test_milvus_down_is_unavailable_and_a_restart_loses_no_acknowledged_file(milvus, tiny_index, tmp_path):
    docs = tmp_path / "docs"
    async with serving(milvus, tiny_index, tmp_path / "collections", timeout_s=3.0) as (stubs, registry):
        await stubs.collections.CreateCollection(pb.CreateCollectionRequest(name="notes"))
        # Files added one after another while searches run; each answered one is acknowledged.
        files = [write(docs / f"part{i}.md", f"# Part {i}\n\nThe number of part {i} is {i * 7919}.\n")
                 for i in range(12)]

        async def search_all_along(stop: asyncio.Event) -> None:
            while not stop.is_set():
                await documents(stubs, "number of part", "notes")

        stop = asyncio.Event()
        searching = asyncio.create_task(search_all_along(stop))
        acknowledged = [r.path for r in await add_files(stubs, "notes", files) if r.status == ADDED]
        stop.set()
        await searching
        assert len(acknowledged) == 12

        milvus.kill()                            # SIGKILL: no flush, no goodbye
        error = await failure(stubs.retriever.Retrieve(pb.RetrieveRequest(query="part", collection="notes")))
        assert error.code() == grpc.StatusCode.UNAVAILABLE and milvus.uri in error.details()
        late = write(docs / "late.md", "# Late\n\nThe late file arrived while Milvus was down.\n")
        error = await failure(stubs.collections.AddFiles(iter([pb.AddFilesRequest(collection="notes", path=late[0],
                                                                                  content=late[1])])))
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "committed" in error.details()

        milvus.start()                           # the same data folder
        index = registry.live("notes").index
        for _ in range(60):                      # the background merger's job, asked for here
            try:
                index.merge()
                break
            except Exception:
                await asyncio.sleep(2)
        assert index.milvus.count() == 13
        for path, _ in files:
            number = int(Path(path).stem.removeprefix("part"))
            found = await documents(stubs, f"The number of part {number}", "notes", top_k=13)
            assert any(from_file(d, path) for d in found)
        found = await documents(stubs, "Which file arrived while Milvus was down?", "notes", top_k=1)
        assert from_file(found[0], late[0])
