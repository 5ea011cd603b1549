"""The first index build resumes after it was cut short (issue 42): in-process, and a SIGKILLed ANNS retriever.

Either way the resumed build embeds only what the cut-short one did not commit (no passage
twice, none missing: the same ids, in the same rows, as a build from scratch), and searches of
it agree with the from-scratch index (recall@10 >= 0.99 against it).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import grpc
import pytest

from protos import retriever_pb2 as pb
from protos import retriever_pb2_grpc
from retriever_svc.anns.index import AnnsIndex
from retriever_svc.corpus.checkpoint import CHECKPOINT
from retriever_svc.corpus.index import MANIFEST, build_index, read_manifest
from tests.support.retrievers import RetrieverProcess
from tests.support.tiny_corpus import build_guide_pages

COMMIT_EVERY = 4


class CutShort(Exception):
    pass


def committed(index_dir: Path) -> int:
    """Passages the checkpoint holds (0 before it has its table)."""
    if not (index_dir / CHECKPOINT).exists():
        return 0
    db = sqlite3.connect(index_dir / CHECKPOINT, timeout=10)
    try:
        return db.execute("SELECT COUNT(*) FROM passages").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def recall_at_10(index: AnnsIndex, reference: AnnsIndex) -> float:
    """Mean recall@10 of `index`'s searches against `reference`'s (by passage id), every passage's vector a query."""
    hits = 0
    for vector in reference.vectors:
        found = [p.id for p in index.passages(index.search(vector, 10, 64, 4)[0]).values()]
        expected = [p.id for p in reference.passages(reference.search(vector, 10, 64, 4)[0]).values()]
        hits += len(set(found) & set(expected))
    return hits / (10 * len(reference.vectors))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return build_guide_pages(tmp_path_factory.mktemp("guide") / "site")


@pytest.fixture(scope="module")
def from_scratch(site, tmp_path_factory):
    out = build_index(site, tmp_path_factory.mktemp("scratch") / "index", progress=False, threads=1,
                      say=lambda _: None).out
    index = AnnsIndex(out)
    yield index
    index.close()


def check_same_as_from_scratch(out: Path, from_scratch: AnnsIndex) -> None:
    index = AnnsIndex(out)
    try:
        assert [p.id for p in index.store.all()] == [p.id for p in from_scratch.store.all()]
        assert recall_at_10(index, from_scratch) >= 0.99
    finally:
        index.close()
    assert not (out / CHECKPOINT).exists()        # the checkpoint goes once the index is installed


def test_a_build_cut_short_resumes_from_its_last_commit_and_says_where(site, from_scratch, tmp_path):
    out = tmp_path / "index"

    def crash_after_first_commit(state: str) -> None:
        if state.startswith("embed ") and not state.startswith("embed 0/"):
            raise CutShort(state)

    with pytest.raises(CutShort):
        build_index(site, out, progress=False, threads=1, say=lambda _: None, on_progress=crash_after_first_commit,
                    commit_every=COMMIT_EVERY)
    assert read_manifest(out) is None
    kept = committed(out)
    assert 0 < kept < from_scratch.size

    states: list[str] = []
    manifest = build_index(site, out, progress=False, threads=1, say=lambda _: None, on_progress=states.append,
                           commit_every=COMMIT_EVERY).manifest
    assert f"embed {kept}/{from_scratch.size} passages; resumed at {kept} of {from_scratch.size}" in states
    assert (manifest["embedding_resumed_at"], manifest["passages_embedded"]) == (kept, from_scratch.size - kept)
    check_same_as_from_scratch(out, from_scratch)


def test_sigkill_of_the_anns_retriever_during_the_first_build_then_restart_resumes_it(site, from_scratch, tmp_path):
    out, collections = tmp_path / "index", tmp_path / "collections"
    flags = ("--index", str(out), "--build-from", str(site), "--collections", str(collections),
             "--build-commit-every", str(COMMIT_EVERY))
    first = RetrieverProcess("anns", tmp_path / "first.log", *flags, wait=False)    # killed mid-build
    try:
        while committed(out) == 0:          # the build has committed something: kill it there
            assert first.process.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
            time.sleep(0.02)
    finally:
        first.kill()
    kept = committed(out)
    assert read_manifest(out) is None, "the build ended before the kill: make the site bigger"
    assert 0 < kept < from_scratch.size

    second = RetrieverProcess("anns", tmp_path / "second.log", *flags)
    try:
        with grpc.insecure_channel(second.address) as channel:
            stub = retriever_pb2_grpc.RetrieverStub(channel)
            while not (info := stub.Describe(pb.RetrieverDescribeRequest(), timeout=30).retriever_info).num_documents:
                assert info.facts["default_state"] == "building", info.facts
                time.sleep(0.1)
            assert info.num_documents == from_scratch.size
            final = [r.chunk for r in stub.Retrieve(pb.RetrieveRequest(query="How do I sort lists?", top_k=3),
                                                    timeout=60)][-1]
            assert "sorting lists" in final.documents[0].title
    finally:
        second.kill()
    manifest = json.loads((out / MANIFEST).read_text())
    assert (manifest["embedding_resumed_at"], manifest["passages_embedded"]) == (kept, from_scratch.size - kept)
    check_same_as_from_scratch(out, from_scratch)


def test_sigterm_during_the_first_build_stops_it_at_a_commit_and_the_retriever_exits_cleanly(site, from_scratch,
                                                                                              tmp_path):
    """What `streamrag down` sends. The build stops at its next commit, keeping every passage committed, and the
    process exits 0: it once left the build running into the interpreter's shutdown, inside the embedding
    runtime's native code, and died of SIGABRT ("terminate called without an active exception")."""
    out, collections = tmp_path / "index", tmp_path / "collections"
    process = RetrieverProcess("anns", tmp_path / "build.log", "--index", str(out), "--build-from", str(site),
                               "--collections", str(collections), "--build-commit-every", str(COMMIT_EVERY),
                               wait=False)
    try:
        while (kept := committed(out)) == 0:
            assert process.process.poll() is None, process.log_text()[-2000:]
            time.sleep(0.02)
    finally:
        code = process.stop(120)
    log = process.log_text()
    assert code == 0, log[-2000:]
    assert read_manifest(out) is None, "the build ended before the signal: make the site bigger"
    assert "the default index build stopped for shutdown" in log, log[-2000:]
    assert kept <= committed(out) < from_scratch.size
