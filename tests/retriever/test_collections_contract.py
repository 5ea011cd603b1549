"""Live collections, the contract: the Collections RPCs and the status of each refusal, merges
answered once merged, isolation between collections, and the default collection answering
UNAVAILABLE with its progress while it builds. A real grpc.aio server on loopback in the test's
event loop (`collections_support.serving`), the real embedding model, a collections folder per test.
"""

from __future__ import annotations

import asyncio
import threading

import grpc

from protos import retriever_pb2 as pb
from retriever_svc.anns.backend import AnnsBackend
from retriever_svc.anns.index import AnnsIndex
from retriever_svc.collections.registry import CollectionRegistry, DefaultCollection
from tests.retriever.collections_support import (
    ADDED,
    ALL,
    FERRIES,
    MOTHS,
    QUESTIONS,
    SCHEDULE,
    ZORBLAX,
    add_files,
    documents,
    failure,
    infos,
    serving,
    write,
)
from tests.support.retrievers import serving_retriever

# ---------------------------------------------------------------- the contract

async def test_create_list_drop_and_the_status_of_each_refusal(tiny_index, tmp_path):
    root = tmp_path / "collections"
    async with serving(tiny_index, root) as stubs:
        listed = await infos(stubs)
        assert list(listed) == ["default"]
        assert listed["default"].is_default and listed["default"].read_only and listed["default"].passages == 5

        created = (await stubs.collections.CreateCollection(pb.CreateCollectionRequest(name="mine"))).collection
        assert (created.name, created.files, created.passages, created.read_only) == ("mine", 0, 0, False)
        listed = await infos(stubs)
        assert list(listed) == ["default", "mine"] and not listed["mine"].is_default
        assert listed["mine"].state == "ready"

        codes = grpc.StatusCode
        for name in ("mine", "default"):
            error = await failure(stubs.collections.CreateCollection(pb.CreateCollectionRequest(name=name)))
            assert error.code() == codes.ALREADY_EXISTS and name in error.details()
        for bad in ("bad name", "a/b", "", "-dash-first", "..", "x" * 65, "caf\u00e9"):
            error = await failure(stubs.collections.CreateCollection(pb.CreateCollectionRequest(name=bad)))
            assert error.code() == codes.INVALID_ARGUMENT and "name" in error.details(), bad
            assert (await failure(stubs.retriever.Retrieve(pb.RetrieveRequest(query="files", collection=bad or "a/b"))
                                  )).code() == codes.INVALID_ARGUMENT, bad
        assert sorted(p.name for p in root.iterdir()) == ["mine"]

        unknown = [stubs.retriever.Retrieve(pb.RetrieveRequest(query="files", collection="nope")),
                   stubs.collections.AddFiles(iter([pb.AddFilesRequest(collection="nope", path="a.md", content=b"a")])),
                   stubs.collections.RemoveFiles(pb.RemoveFilesRequest(collection="nope", paths=["a.md"])),
                   stubs.collections.MergeCollection(pb.MergeCollectionRequest(name="nope")),
                   stubs.collections.DropCollection(pb.DropCollectionRequest(name="nope"))]
        for call in unknown:
            error = await failure(call)
            assert error.code() == codes.NOT_FOUND and "nope" in error.details()
        read_only = [stubs.collections.AddFiles(iter([pb.AddFilesRequest(collection="default", path="a.md",
                                                                         content=b"# A\n\nText.")])),
                     stubs.collections.RemoveFiles(pb.RemoveFilesRequest(collection="default", paths=["a.md"])),
                     stubs.collections.MergeCollection(pb.MergeCollectionRequest(name="default")),
                     stubs.collections.DropCollection(pb.DropCollectionRequest(name="default"))]
        for call in read_only:
            assert (await failure(call)).code() == codes.FAILED_PRECONDITION
        assert (await infos(stubs))["default"].passages == 5

        for name in ("", "default"):       # the default collection answers as the plain Retriever does
            found = await documents(stubs, "How do lists work?", name)
            assert found[0].url == "lists.html" and len(found) == 3
        assert await documents(stubs, "How do lists work?", "mine") == []      # empty, but there

        path, content = write(tmp_path / "docs" / "zorblax.md", ZORBLAX)
        assert [r.status for r in await add_files(stubs, "mine", [(path, content)])] == [ADDED]
        dropped = (await stubs.collections.DropCollection(pb.DropCollectionRequest(name="mine"))).dropped
        assert (dropped.name, dropped.files) == ("mine", 1) and dropped.passages >= 1
        assert list(await infos(stubs)) == ["default"]
        assert list(root.iterdir()) == []                                    # no folder, no .dropped-* left
        error = await failure(stubs.retriever.Retrieve(pb.RetrieveRequest(query="zorblax", collection="mine")))
        assert error.code() == codes.NOT_FOUND
        await stubs.collections.CreateCollection(pb.CreateCollectionRequest(name="mine"))    # the name is free again
        assert (await infos(stubs))["mine"].files == 0
        assert await documents(stubs, QUESTIONS["zorblax.md"], "mine") == []


async def test_remove_files_refuses_an_empty_path(tiny_index, tmp_path):
    async with serving(tiny_index, tmp_path / "collections") as stubs:
        await stubs.collections.CreateCollection(pb.CreateCollectionRequest(name="mine"))
        await add_files(stubs, "mine", [write(tmp_path / "docs" / "zorblax.md", ZORBLAX)])
        try:
            response = await stubs.collections.RemoveFiles(pb.RemoveFilesRequest(collection="mine", paths=[""]))
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        else:
            assert list(response.removed) == []
        assert (await infos(stubs))["mine"].files == 1


async def test_merge_collection_answers_only_once_merged_even_while_another_merge_runs(tiny_index, tmp_path,
                                                                                        monkeypatch):
    from retriever_svc.collections import live

    started, release = threading.Event(), threading.Event()
    build = live.build_disk_index

    def held_build(*args, **kwargs):
        started.set()
        release.wait(30)
        return build(*args, **kwargs)

    monkeypatch.setattr(live, "build_disk_index", held_build)
    async with serving(tiny_index, tmp_path / "collections") as stubs:
        await stubs.collections.CreateCollection(pb.CreateCollectionRequest(name="mine"))
        await add_files(stubs, "mine", [write(tmp_path / "docs" / "zorblax.md", ZORBLAX)])
        request = pb.MergeCollectionRequest(name="mine")
        first = asyncio.ensure_future(stubs.collections.MergeCollection(request))
        try:
            assert await asyncio.to_thread(started.wait, 60)
            second = asyncio.ensure_future(stubs.collections.MergeCollection(request))
            await asyncio.wait([second], timeout=3)     # answering before the first merge ends is the bug
        finally:
            release.set()
        for answer in (await second, await first):
            info = answer.collection
            assert (info.memory_passages, info.disk_passages) == (0, info.passages), info


# ---------------------------------------------------------------- isolation

async def test_a_file_added_to_one_collection_is_never_returned_by_another(tiny_index, tmp_path):
    shared = "shared/notes.md"          # the same path in both collections, with other content
    async with serving(tiny_index, tmp_path / "collections") as stubs:
        for name in ("alpha", "beta"):
            await stubs.collections.CreateCollection(pb.CreateCollectionRequest(name=name))
        answers = await add_files(stubs, "alpha", [(shared, ZORBLAX.encode()), ("alpha/moths.md", MOTHS[1].encode())])
        assert [a.status for a in answers] == [ADDED] * 2
        assert [a.status for a in await add_files(stubs, "beta", [(shared, FERRIES.encode())])] == [ADDED]

        async def texts(collection: str, question: str) -> list[str]:
            return [d.text for d in await documents(stubs, question, collection, top_k=ALL)]

        alpha_ids = {d.id for d in await documents(stubs, "anything", "alpha", top_k=ALL)}
        for question in (QUESTIONS["zorblax.md"], QUESTIONS["moths.pdf"], QUESTIONS["ferries.rst"]):
            found = await documents(stubs, question, "beta", top_k=ALL)
            assert found and not {d.id for d in found} & alpha_ids
            assert not any("zorblax" in d.text or "moths" in d.text for d in found)
            assert not any("Quibbleton" in t for t in await texts("alpha", question))
            assert not any(d.url.startswith(("shared/", "alpha/")) for d in await documents(stubs, question, ""))

        await stubs.collections.RemoveFiles(pb.RemoveFilesRequest(collection="alpha", paths=["shared"]))
        assert any("Quibbleton" in t for t in await texts("beta", QUESTIONS["ferries.rst"]))
        await stubs.collections.DropCollection(pb.DropCollectionRequest(name="alpha"))
        assert any("Quibbleton" in t for t in await texts("beta", QUESTIONS["ferries.rst"]))
        assert (await infos(stubs))["beta"].files == 1


# ---------------------------------------------------------------- the default index building in the background

async def test_the_default_collection_answers_unavailable_with_progress_while_it_builds(tiny_index, tmp_path):
    release = threading.Event()

    def build(report) -> AnnsIndex:
        report("embed 1024/14781 passages")
        release.wait(60)
        return AnnsIndex(tiny_index)

    default = DefaultCollection()
    registry = CollectionRegistry(tmp_path / "collections", default)
    backend = AnnsBackend(registry, schedule=SCHEDULE, beam_width=4)
    try:
        async with serving_retriever(backend, "anns") as stubs:
            thread = default.build_in_background(build)
            while not default.progress:
                await asyncio.sleep(0.01)
            error = await failure(stubs.retriever.Retrieve(pb.RetrieveRequest(query="sort a list")))
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert "still building (embed 1024/14781 passages)" in error.details()
            assert (await infos(stubs))["default"].state == "building"
            await stubs.collections.CreateCollection(pb.CreateCollectionRequest(name="mine"))   # the others serve
            assert (await documents(stubs, "anything", "mine")) == []
            release.set()
            await asyncio.to_thread(thread.join, 60)
            assert (await infos(stubs))["default"].state == "ready"
            assert (await documents(stubs, "How do I sort a list?", ""))[0].url == "lists.html"
    finally:
        release.set()
        registry.close()
