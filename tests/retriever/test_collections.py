"""Live collections: files added to and removed from named collections while the ANNS retriever serves.

The contract and the answers go through a real grpc.aio server (`server.build_runner`, Retriever and
Collections) on loopback in the test's event loop, with the real embedding model, the tiny default
index and a collections folder per test. The live index's invariants under random adds, replaces,
removes, merges and reopenings are a Hypothesis property at the `Collection` level, with random
unit vectors standing in for the model. Last, a retriever process is SIGKILLed in the middle of an
AddFiles stream and restarted: every file it acknowledged is there, whole and searchable.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
import sqlite3
import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from fpdf import FPDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos import retriever_pb2 as pb
from protos import retriever_pb2_grpc
from retriever_svc.anns.backend import AnnsBackend
from retriever_svc.anns.index import AnnsIndex
from retriever_svc.collections.collection import STORE_FILE, Added, Collection, file_passages
from retriever_svc.collections.registry import CollectionRegistry, DefaultCollection
from retriever_svc.corpus.passages import approx_tokens
from retriever_svc.server import build_runner
from servicekit.config import ServiceConfig
from tests.retriever import build_tiny_index
from tests.support.retriever_process import RetrieverProcess

REPO = Path(__file__).resolve().parents[2]
SCHEDULE = (8, 32, 64)
ALL = 100                       # top_k that covers every passage of the collections made here
ADDED, REPLACED, UNCHANGED, FAILED = (pb.ADD_FILE_STATUS_ADDED, pb.ADD_FILE_STATUS_REPLACED,
                                      pb.ADD_FILE_STATUS_UNCHANGED, pb.ADD_FILE_STATUS_FAILED)


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory) -> Path:
    return build_tiny_index(tmp_path_factory.mktemp("collections-tiny"))


# ---------------------------------------------------------------- serving in the test's event loop

@dataclass
class Stubs:
    collections: retriever_pb2_grpc.CollectionsStub
    retriever: retriever_pb2_grpc.RetrieverStub


@asynccontextmanager
async def serving(tiny_index: Path, root: Path) -> AsyncIterator[Stubs]:
    """The retriever as `serve` runs it, without the background merger (merges are asked for here); the default
    collection is the tiny index."""
    registry = CollectionRegistry(root, DefaultCollection(AnnsIndex(tiny_index)))
    backend = AnnsBackend(registry, schedule=SCHEDULE, beam_width=4)
    runner, _background = build_runner(ServiceConfig(service="anns", port=0, metrics_port=None), backend)
    port = await runner.start(handle_signals=False)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Stubs(retriever_pb2_grpc.CollectionsStub(channel), retriever_pb2_grpc.RetrieverStub(channel))
    finally:
        await channel.close()
        await runner.stop(0)
        registry.close()
        backend.index.close()


async def documents(stubs: Stubs, query: str, collection: str, top_k: int = 3) -> list:
    """The final list of a Retrieve."""
    request = pb.RetrieveRequest(query=query, top_k=top_k, collection=collection)
    chunks = [response.chunk async for response in stubs.retriever.Retrieve(request)]
    assert chunks and chunks[-1].final
    return list(chunks[-1].documents)


async def add_files(stubs: Stubs, collection: str, files: list[tuple[str, bytes]]) -> list[pb.AddFilesResponse]:
    requests = [pb.AddFilesRequest(collection=collection, path=path, content=content) for path, content in files]
    return [response async for response in stubs.collections.AddFiles(iter(requests))]


async def infos(stubs: Stubs) -> dict[str, pb.CollectionInfo]:
    listed = await stubs.collections.ListCollections(pb.ListCollectionsRequest())
    return {info.name: info for info in listed.collections}


async def failure(call) -> grpc.aio.AioRpcError:
    """The error a call ends with (unary calls are awaited, streaming ones read to the end)."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    return caught.value


def from_file(document, path: str) -> bool:
    return document.url == path or document.url.startswith(path + "#")


# ---------------------------------------------------------------- files with made-up facts

def pdf_bytes(*paragraphs: str) -> bytes:
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    pdf.add_page()
    pdf.multi_cell(0, 8, "\n\n".join(paragraphs))
    return bytes(pdf.output())


ZORBLAX = ("# Zorblax engines\n\nThe zorblax engine of the airship Velmora burns purple quartz crystals "
           "instead of coal.\n\n## Upkeep\n\nIts crystals are polished with goat butter every seventh day.\n")
FERRIES = ("Quibbleton ferries\n==================\n\nThe ferries of Quibbleton sail only on Tuesdays, and only "
           "after the harbour bell has rung thirteen times.\n")
FERRIES_CHANGED = ("Quibbleton ferries\n==================\n\nThe ferries of Quibbleton are now pulled across the "
                   "bay by trained otters wearing brass harnesses.\n")
MARMALADE = ("Grandmother Ostrava's marmalade\n\nBoil eleven bitter oranges with a cup of smoked sea salt for "
             "exactly four hours, stirring with a cedar spoon.\n")
OBSERVATORY = ("<html><head><title>Kestrel Peak Observatory</title></head><body><h1>Kestrel Peak Observatory</h1>"
               "<p>The observatory on Kestrel Peak tracks the comet Harrow-9 with a telescope carved from glacier "
               "ice.</p></body></html>")
MOTHS = ("Lantern Moth Handbook.", "Lantern moths of the Brisk Valley glow blue whenever they smell cinnamon, "
         "and they migrate south every leap year.")
BADGERS = "# Badger choir\n\nThe badger choir of Millbrook sings only in D minor, and only during hailstorms.\n"
# file name -> (question answered by exactly that file)
QUESTIONS = {
    "zorblax.md": "What does the zorblax engine of the airship burn instead of coal?",
    "ferries.rst": "On which day do the ferries of Quibbleton sail?",
    "notes/marmalade.txt": "How long are the bitter oranges boiled for the marmalade?",
    "notes/observatory.html": "Which comet does the observatory on Kestrel Peak track?",
    "moths.pdf": "Why do lantern moths glow blue?",
    "notes-extra.md": "In which key does the badger choir of Millbrook sing?",
}


def write(path: Path, data: bytes | str) -> tuple[str, bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path), path.read_bytes()


# ---------------------------------------------------------------- 1. the contract

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


# ---------------------------------------------------------------- 2. real files, real model

async def test_mixed_files_are_indexed_answered_replaced_removed_and_merged(tiny_index, tmp_path):
    docs = tmp_path / "docs"
    good = {"zorblax.md": ZORBLAX, "ferries.rst": FERRIES, "notes/marmalade.txt": MARMALADE,
            "notes/observatory.html": OBSERVATORY, "moths.pdf": pdf_bytes(*MOTHS), "notes-extra.md": BADGERS}
    bad = {"broken.pdf": b"%PDF-1.7\n garbage \x00\xff" * 40,             # name -> what its message says
           "blob.txt": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 8,
           "picture.png": b"\x89PNG\r\n\x1a\n",
           "empty.md": b"\n\n"}
    says = {"broken.pdf": "PDF", "blob.txt": "binary", "picture.png": "unsupported", "empty.md": "no text"}
    order = ["zorblax.md", "broken.pdf", "ferries.rst", "blob.txt", "notes/marmalade.txt", "notes/observatory.html",
             "picture.png", "moths.pdf", "empty.md", "notes-extra.md"]
    files = [write(docs / name, good.get(name) or bad[name]) for name in order]
    path_of = {name: str(docs / name) for name in order}

    async with serving(tiny_index, tmp_path / "collections") as stubs:
        await stubs.collections.CreateCollection(pb.CreateCollectionRequest(name="mine"))
        answers = await add_files(stubs, "mine", files)
        assert [a.path for a in answers] == [path for path, _ in files]            # one answer per file, in order
        for name, answer in zip(order, answers, strict=True):
            if name in good:
                assert answer.status == ADDED and answer.passages >= 1 and not answer.message, name
            else:
                assert answer.status == FAILED and answer.passages == 0, name
                assert says[name] in answer.message and "\n" not in answer.message, (name, answer.message)
        passages = {name: a.passages for name, a in zip(order, answers, strict=True) if name in good}
        info = (await infos(stubs))["mine"]
        assert (info.files, info.passages, info.memory_passages) == (6, sum(passages.values()), sum(passages.values()))

        async def top_files() -> dict[str, str]:
            """question's file -> the file of the top answer"""
            tops = {}
            for name, question in QUESTIONS.items():
                top = (await documents(stubs, question, "mine"))[0]
                tops[name] = next((n for n in good if from_file(top, path_of[n])), top.url)
            return tops

        async def everything() -> dict[str, object]:
            found = await documents(stubs, "anything at all", "mine", top_k=ALL)
            assert len({d.id for d in found}) == len(found)
            return {d.id: d for d in found}

        assert await top_files() == {name: name for name in QUESTIONS}
        before = await everything()
        assert len(before) == sum(passages.values())
        assert all(any(from_file(d, path_of[n]) for n in good) for d in before.values())

        # The same bytes again: nothing done. Other bytes: the old passages go for good.
        again = await add_files(stubs, "mine", [files[0], write(docs / "ferries.rst", FERRIES_CHANGED)])
        assert [(a.status, a.passages) for a in again] == [(UNCHANGED, passages["zorblax.md"]),
                                                           (REPLACED, again[1].passages)]
        old_ferry_ids = {i for i, d in before.items() if from_file(d, path_of["ferries.rst"])}
        now = await everything()
        assert old_ferry_ids and not old_ferry_ids & set(now)
        assert not any("thirteen" in d.text for d in now.values())
        assert len(now) == len(before) - len(old_ferry_ids) + again[1].passages
        found = await documents(stubs, "Which animals pull the Quibbleton ferries across the bay?", "mine")
        assert from_file(found[0], path_of["ferries.rst"]) and "otters" in found[0].text
        for question in (QUESTIONS["ferries.rst"], "The harbour bell has rung thirteen times"):
            assert not set(d.id for d in await documents(stubs, question, "mine", top_k=ALL)) & old_ferry_ids

        # A folder takes every file under it, and nothing that merely starts with its name.
        removed = await stubs.collections.RemoveFiles(pb.RemoveFilesRequest(collection="mine",
                                                                            paths=[str(docs / "notes")]))
        gone = ["notes/marmalade.txt", "notes/observatory.html"]
        assert list(removed.removed) == sorted(path_of[n] for n in gone)
        assert removed.passages == sum(passages[n] for n in gone)
        remaining = await everything()
        assert not any(from_file(d, path_of[n]) for d in remaining.values() for n in gone)
        assert any(from_file(d, path_of["notes-extra.md"]) for d in remaining.values())
        assert set(remaining) == set(now) - {i for i, d in now.items() if any(from_file(d, path_of[n]) for n in gone)}
        for name in gone:
            assert not any(from_file(d, path_of[name]) for d in await documents(stubs, QUESTIONS[name], "mine"))
        empty = await stubs.collections.RemoveFiles(pb.RemoveFilesRequest(collection="mine", paths=[str(docs / "no")]))
        assert list(empty.removed) == [] and empty.passages == 0

        # Merging moves everything to a disk index; the answers stay the same.
        tops = {n: t for n, t in (await top_files()).items() if n not in gone}
        merged = (await stubs.collections.MergeCollection(pb.MergeCollectionRequest(name="mine"))).collection
        assert (merged.files, merged.passages, merged.disk_passages, merged.memory_passages,
                merged.deleted_passages) == (4, len(remaining), len(remaining), 0, 0)
        assert set(await everything()) == set(remaining)
        assert {n: t for n, t in (await top_files()).items() if n not in gone} == tops == {n: n for n in tops}

        # Removing from the disk part marks passages deleted; they are never returned.
        removed = await stubs.collections.RemoveFiles(pb.RemoveFilesRequest(collection="mine",
                                                                            paths=[path_of["moths.pdf"]]))
        assert list(removed.removed) == [path_of["moths.pdf"]]
        info = (await infos(stubs))["mine"]
        assert (info.files, info.deleted_passages) == (3, passages["moths.pdf"])
        left = await everything()
        assert set(left) == {i for i, d in remaining.items() if not from_file(d, path_of["moths.pdf"])}
        assert not any(from_file(d, path_of["moths.pdf"]) for d in await documents(stubs, QUESTIONS["moths.pdf"],
                                                                                     "mine", top_k=ALL))


# ---------------------------------------------------------------- 3. isolation

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


# ---------------------------------------------------------------- 4. the live index's invariants

PATHS = ["a.md", "d/b.md", "d/e/c.txt", "d2/f.md", "d-x.md"]
TARGETS = ["a.md", "d", "d/", "d/e", "d/b.md", "d2", "nothing", ""]
WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "iris", "juniper", "kelp", "lumen",
         "maple", "nectar", "onyx", "pebble", "quartz", "raven", "sable", "thistle", "umber", "violet", "willow"]


def fake_content(path: str, version: int) -> bytes:
    """1-3 sections of about 150 words each (each its own passage), fixed by (path, version)."""
    rng = random.Random(f"{path}@{version}")
    sections = [f"## Part {s}\n\n" + " ".join(rng.choice(WORDS) for _ in range(150)) for s in range(rng.randint(1, 3))]
    return "\n\n".join(sections).encode()


def fake_embed(passages) -> np.ndarray:
    """A deterministic random unit vector per passage text."""
    vectors = []
    for passage in passages:
        seed = int.from_bytes(hashlib.sha256(passage.text.encode()).digest()[:8], "little")
        vector = np.random.default_rng(seed).standard_normal(384)
        vectors.append(vector / np.linalg.norm(vector))
    return np.asarray(vectors, dtype=np.float32).reshape(-1, 384)


def under(target: str, path: str) -> bool:
    return path == target or path.startswith(target.rstrip("/") + "/")


OPERATIONS = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(PATHS), st.integers(0, 2)),
    st.tuples(st.just("remove"), st.sampled_from(TARGETS)),
    st.tuples(st.just("merge")),
    st.tuples(st.just("reopen")),
)


def check_searches(collection: Collection, queries: np.ndarray) -> None:
    store, index = collection.store, collection.index
    pids, vectors = store.vectors()
    live = len(pids)
    assert index.view.size == live == store.counts()[1]
    true = {int(p): v for p, v in zip(pids, vectors, strict=True)}
    for query in queries:
        for k in (1, 3, live + 2):
            found, distances = index.search(query, k, max(k, live, 1), 4)
            assert len(found) == len(set(found)) == min(k, live)
            assert distances == sorted(distances)
            assert len(store.passages(found)) == len(found)                     # none removed
            assert np.allclose(distances, [2 - 2 * float(true[p] @ query) for p in found], atol=1e-3)
            if k >= live:
                assert set(found) == set(index.exact(query, live)) == set(true)
        final = list(index.stages(query, live + 5, (2, live + 8), 4))[-1]
        assert final.final and set(final.rows) == set(true) and len(final.rows) == live
        assert final.distances == sorted(final.distances)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=st.lists(OPERATIONS, min_size=1, max_size=12), seed=st.integers(0, 2**32 - 1))
def test_searches_return_live_passages_only_and_all_of_them_at_full_k(operations, seed):
    queries = np.random.default_rng(seed).standard_normal((3, 384)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    with tempfile.TemporaryDirectory() as directory:
        collection = Collection("prop", Path(directory))
        model: dict[str, int] = {}                        # path -> version indexed
        try:
            for operation in operations:
                if operation[0] == "add":
                    _, path, version = operation
                    result = collection.add_file(path, fake_content(path, version), approx_tokens, fake_embed)
                    expected = (Added.ADDED if path not in model else
                                Added.UNCHANGED if model[path] == version else Added.REPLACED)
                    assert result.status == expected and result.passages >= 1
                    model[path] = version
                elif operation[0] == "remove":
                    removed, _ = collection.remove([operation[1]])
                    assert removed == sorted(p for p in model if under(operation[1], p))
                    model = {p: v for p, v in model.items() if p not in removed}
                elif operation[0] == "merge":
                    assert collection.index.merge()
                    assert len(collection.index.view.memory_pids) == len(collection.index.view.deleted) == 0
                else:                                     # a restart: the index is rebuilt from the store
                    collection.close()
                    collection = Collection("prop", Path(directory))
                for path, version in model.items():
                    assert collection.store.file(path)[0] == hashlib.sha256(fake_content(path, version)).hexdigest()
                assert collection.store.counts()[0] == len(model)
                check_searches(collection, queries)
        finally:
            collection.close()


def unit_queries(count: int, seed: int) -> np.ndarray:
    queries = np.random.default_rng(seed).standard_normal((count, 384)).astype(np.float32)
    return queries / np.linalg.norm(queries, axis=1, keepdims=True)


def test_after_removals_from_the_disk_part_a_search_still_returns_the_k_nearest_live_passages(tmp_path):
    collection = Collection("holes", tmp_path)
    try:
        for i in range(40):
            collection.add_file(f"f{i:02d}.txt", f"passage {i} of forty".encode(), approx_tokens, fake_embed)
        assert collection.index.merge()
        collection.remove([f"f{i:02d}.txt" for i in range(0, 40, 5)])     # 8 of 40: below the merge threshold
        assert collection.size == 32 and not collection.index.needs_merge()
        short = []
        for query in unit_queries(30, seed=3):
            final = list(collection.stages(query, 10, (16, 64), 4))[-1]  # L 64 > 40 passages: exact
            if set(final.rows) != set(collection.exact(query, 10)):
                short.append(len(final.rows))
        assert short == [], f"{len(short)} of 30 searches missed live neighbours (lists of {short} instead of 10)"
    finally:
        collection.close()


@pytest.mark.parametrize("version", [None, 1], ids=["new-file", "replaced-file"])
def test_a_merge_between_a_files_commit_and_its_publish_leaves_each_passage_once(tmp_path, version):
    collection = Collection("race", tmp_path)
    try:
        collection.add_file("a.md", fake_content("a.md", 0), approx_tokens, fake_embed)
        publish = collection.index.apply
        merging = threading.Thread(target=collection.index.merge)   # the background merger, at the worst time

        def publish_while_a_merge_starts(change, vectors) -> None:
            merging.start()
            merging.join(0.5)          # it must wait for this publish, not snapshot the store without it
            publish(change, vectors)

        collection.index.apply = publish_while_a_merge_starts
        path, content = ("b.md", fake_content("b.md", 0)) if version is None else ("a.md", fake_content("a.md", 1))
        collection.add_file(path, content, approx_tokens, fake_embed)
        merging.join()
        live = collection.store.counts()[1]
        found, _ = collection.index.search(unit_queries(1, seed=5)[0], live + 5, 64, 4)
        assert (len(found), len(set(found)), collection.index.view.size) == (live, live, live)
    finally:
        collection.close()


# ---------------------------------------------------------------- 5. SIGKILL in the middle of AddFiles

def crash_files(folder: str, count: int) -> list[tuple[str, bytes]]:
    """Distinct small Markdown files of two passages each; a file's first paragraph is its question."""
    rng = random.Random(7)
    files = []
    for i in range(count):
        paragraphs = [" ".join(rng.choice(WORDS) for _ in range(110)) for _ in range(2)]
        files.append((f"{folder}/note-{i:02d}.md", f"# Note {i}\n\n{paragraphs[0]}\n\n{paragraphs[1]}\n".encode()))
    return files


def stored(store: Path) -> dict[str, tuple[str, int, list[str]]]:
    """path -> (sha256, files.passages, ids of its rows in passages by pid), read from the SQLite store read-only."""
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        files = {path: (sha, n, []) for path, sha, n in db.execute("SELECT path, sha256, passages FROM files")}
        for path, passage_id in db.execute("SELECT path, id FROM passages ORDER BY pid"):
            assert path in files, f"passage {passage_id} of {path}, a file the store does not have"
            files[path][2].append(passage_id)
    finally:
        db.close()
    return files


def test_sigkill_during_add_files_loses_no_acknowledged_file_and_leaves_none_half_indexed(tiny_index, tmp_path):
    from retriever_svc.corpus.index import token_counter

    collections, files = tmp_path / "collections", crash_files("batch", 40)
    content_of = dict(files)
    count_tokens = token_counter()
    expected_ids = {path: [p.id for p in file_passages(path, data, hashlib.sha256(data).hexdigest(), count_tokens)]
                    for path, data in files}
    acknowledged: dict[str, int] = {}
    in_flight = threading.Semaphore(15)      # files sent but not answered: the stream is still going at the kill

    def requests():
        for path, data in files:
            in_flight.acquire(timeout=60)
            yield pb.AddFilesRequest(collection="crash", path=path, content=data)

    first = RetrieverProcess(tmp_path / "first.log", "--index", str(tiny_index), "--collections", str(collections))
    channel = None
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{first.wait_for_port()}")
        stub = retriever_pb2_grpc.CollectionsStub(channel)
        stub.CreateCollection(pb.CreateCollectionRequest(name="crash"), timeout=60)
        try:
            for answer in stub.AddFiles(requests(), timeout=120):
                assert answer.status == ADDED, answer
                acknowledged[answer.path] = answer.passages      # answers already on their way count too
                in_flight.release()
                if len(acknowledged) == 10:
                    first.kill()
        except grpc.RpcError:
            pass
        assert first.process.returncode == -signal.SIGKILL
        assert 10 <= len(acknowledged) < len(files)
    finally:
        in_flight.release(len(files))
        if channel is not None:
            channel.close()
        first.kill()

    second = RetrieverProcess(tmp_path / "second.log", "--index", str(tiny_index), "--collections", str(collections))
    channel = None
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{second.wait_for_port()}")
        stub = retriever_pb2_grpc.CollectionsStub(channel)
        retriever = retriever_pb2_grpc.RetrieverStub(channel)

        present = stored(collections / "crash" / STORE_FILE)
        assert set(acknowledged) <= set(present) <= set(content_of)
        for path, (sha, passages, ids) in present.items():
            assert sha == hashlib.sha256(content_of[path]).hexdigest(), path
            assert ids == expected_ids[path] and passages == len(ids), f"{path} is half indexed"
            if path in acknowledged:
                assert acknowledged[path] == passages, path
        listed = {i.name: i for i in stub.ListCollections(pb.ListCollectionsRequest(), timeout=30).collections}
        assert listed["crash"].files == len(present) >= len(acknowledged)
        assert listed["crash"].passages == sum(len(ids) for _, _, ids in present.values())

        def final(query: str, top_k: int) -> list:
            chunks = [r.chunk for r in retriever.Retrieve(
                pb.RetrieveRequest(query=query, top_k=top_k, collection="crash"), timeout=60)]
            assert chunks[-1].final
            return list(chunks[-1].documents)

        everything = final("note", ALL)
        assert {d.id for d in everything} == {i for _, _, ids in present.values() for i in ids}
        paths = sorted(acknowledged)
        for path in (paths[0], paths[len(paths) // 2], paths[-1]):
            question = content_of[path].decode().split("\n\n")[1]
            assert any(from_file(d, path) for d in final(question, 5)), path

        # Sending everything again completes the collection: what it had is unchanged.
        answers = list(stub.AddFiles((pb.AddFilesRequest(collection="crash", path=path, content=data)
                                      for path, data in files), timeout=180))
        assert [a.status for a in answers] == [UNCHANGED if path in present else ADDED for path, _ in files]
        assert stub.ListCollections(pb.ListCollectionsRequest(), timeout=30).collections[1].files == len(files)
    finally:
        if channel is not None:
            channel.close()
        second.kill()


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
    runner, _background = build_runner(ServiceConfig(service="anns", port=0, metrics_port=None), backend)
    port = await runner.start(handle_signals=False)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stubs = Stubs(retriever_pb2_grpc.CollectionsStub(channel), retriever_pb2_grpc.RetrieverStub(channel))
    try:
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
        await channel.close()
        await runner.stop(0)
        registry.close()
