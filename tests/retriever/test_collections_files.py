"""Live collections with real files and the real model: Markdown, reST, text, HTML and PDF files
indexed, answered, replaced, removed and merged while the retriever serves.
"""

from __future__ import annotations

from protos import retriever_pb2 as pb
from tests.retriever.collections_support import (
    ADDED,
    ALL,
    BADGERS,
    FAILED,
    FERRIES,
    FERRIES_CHANGED,
    MARMALADE,
    MOTHS,
    OBSERVATORY,
    QUESTIONS,
    REPLACED,
    UNCHANGED,
    ZORBLAX,
    add_files,
    documents,
    from_file,
    infos,
    pdf_bytes,
    serving,
    write,
)

# ---------------------------------------------------------------- real files, real model

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
