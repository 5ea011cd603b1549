"""A retriever process SIGKILLed in the middle of an AddFiles stream and restarted: every file it
acknowledged is there, whole and searchable, and none is half indexed.
"""

from __future__ import annotations

import hashlib
import random
import signal
import sqlite3
import threading
from pathlib import Path

import grpc

from protos import retriever_pb2 as pb
from protos import retriever_pb2_grpc
from retriever_svc.collections.collection import STORE_FILE, file_passages
from tests.retriever.collections_support import ADDED, ALL, UNCHANGED, WORDS, from_file
from tests.support.retrievers import RetrieverProcess

# ---------------------------------------------------------------- SIGKILL in the middle of AddFiles

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

    flags = ("--index", str(tiny_index), "--collections", str(collections))
    first = RetrieverProcess("anns", tmp_path / "first.log", *flags)
    channel = None
    try:
        channel = grpc.insecure_channel(first.address)
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

    second = RetrieverProcess("anns", tmp_path / "second.log", *flags)
    channel = None
    try:
        channel = grpc.insecure_channel(second.address)
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
