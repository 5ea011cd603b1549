"""The Milvus backend's adapter, at its seam with pymilvus (default suite; tests/retriever/test_milvus.py runs the
same code against the embedded Milvus server with --run-milvus).

The seam is `MilvusIndex._open`, the one place a pymilvus `Collection` is made: here it gives an
in-memory collection that answers `search`, `insert`, `delete` (by `pid in [...]`), `query` and
`flush` as Milvus does for this schema (inner-product scores, a search list below k refused), and
can be told to fail as a Milvus that is down does.
"""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

pytest.importorskip("pymilvus")

from pymilvus import MilvusException

from protos import retriever_pb2 as pb
from retriever_svc.collections.collection import Added, Collection
from retriever_svc.collections.registry import CollectionRegistry, DefaultCollection
from retriever_svc.corpus.passages import approx_tokens
from retriever_svc.milvus import index as milvus_index
from retriever_svc.milvus.backend import MilvusAnnsBackend, build_backend
from retriever_svc.milvus.connection import MilvusConnection, MilvusSettings, max_search_list
from retriever_svc.milvus.live import MilvusLiveIndex
from retriever_svc.service import RetrieverUnavailable
from tests.retriever.collections_support import fake_content, fake_embed
from tests.support.retrievers import serving_retriever


class FakeMilvusCollection:
    """One Milvus collection in memory (pid -> unit vector); `down` makes every call fail as an unreachable one."""

    def __init__(self, index_type: str) -> None:
        self.index_type = index_type
        self.rows: dict[int, np.ndarray] = {}
        self.searches: list[dict] = []
        self.flushes = 0
        self.down = False
        self.delay_s = 0.0

    def _check(self) -> None:
        time.sleep(self.delay_s)
        if self.down:
            raise MilvusException(2, "Fail connecting to server on 127.0.0.1:1, illegal connection params or server "
                                     "unavailable")

    def search(self, data, anns_field, param, limit, timeout, consistency_level):
        self._check()
        size = next(iter(param["params"].values()))
        if size < limit or size > max_search_list(self.index_type, limit):
            raise MilvusException(1100, f"search list {size} out of range for topk {limit}")
        self.searches.append(param["params"])
        pids = sorted(self.rows)
        if not pids:
            return [[]]
        scores = np.stack([self.rows[p] for p in pids]) @ np.asarray(data[0], dtype=np.float32)
        top = np.argsort(-scores, kind="stable")[:limit]
        return [[SimpleNamespace(id=pids[i], distance=float(scores[i])) for i in top]]

    def insert(self, rows, timeout):
        self._check()
        for pid, vector in zip(rows[0], rows[1], strict=True):
            self.rows[int(pid)] = np.asarray(vector, dtype=np.float32)

    def delete(self, expr, timeout):
        self._check()
        for pid in re.findall(r"\d+", expr.split(" in ", 1)[1]):
            self.rows.pop(int(pid), None)

    def query(self, expr, output_fields, consistency_level, timeout, limit=None):
        self._check()
        if output_fields == ["count(*)"]:
            return [{"count(*)": len(self.rows)}]
        low, high = map(int, re.findall(r"\d+", expr))
        return [{"pid": p} for p in self.rows if low <= p < high]

    def flush(self, timeout):
        self._check()
        self.flushes += 1


class FakeConnection(MilvusConnection):
    def __init__(self, index_type: str = "HNSW") -> None:
        super().__init__(MilvusSettings("http://milvus.invalid:19530", index_type))
        self.collections: dict[str, FakeMilvusCollection] = {}
        self.server_version = "v2.3.5-test"

    def connect(self):
        return self

    def down(self, value: bool) -> None:
        for collection in self.collections.values():
            collection.down = value


@pytest.fixture
def connection(monkeypatch) -> FakeConnection:
    connection = FakeConnection()

    def open_(index):
        return connection.collections.setdefault(index.name, FakeMilvusCollection(index.index_type))

    monkeypatch.setattr(milvus_index.MilvusIndex, "_open", open_)
    monkeypatch.setattr(milvus_index.MilvusIndex, "drop", lambda index: connection.collections.pop(index.name, None))
    return connection


def unit(seed: int) -> np.ndarray:
    vector = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return vector / np.linalg.norm(vector)


@pytest.mark.parametrize("index_type, key, cap", [("DISKANN", "search_list", 200), ("HNSW", "ef", 256)])
def test_each_stage_is_one_search_at_its_list_size_capped_where_milvus_caps_it(monkeypatch, index_type, key, cap):
    connection = FakeConnection(index_type)
    collection = FakeMilvusCollection(index_type)
    monkeypatch.setattr(milvus_index.MilvusIndex, "_open", lambda index: collection)
    index = milvus_index.MilvusIndex(connection, "c")
    vectors = np.stack([unit(i) for i in range(50)])
    index.insert(list(range(50)), vectors)
    stages = list(index.stages(vectors[7], 10, (4, 16, 64, 256)))
    # L below k is raised to k; past Milvus's cap (DISKANN: 200 for k <= 20) the last stage is the cap, once.
    assert [s.search_list_size for s in stages] == [10, 16, 64, cap]
    assert [search[key] for search in collection.searches] == [10, 16, 64, cap]
    assert stages[-1].final and stages[-1].rows[0] == 7 and stages[-1].distances[0] == pytest.approx(0.0, abs=1e-5)
    exact = np.argsort(-(vectors @ vectors[7]))[:10].tolist()
    assert stages[-1].rows == exact            # squared L2 from inner products: the same order


def test_a_live_collection_mirrors_its_store_in_milvus_through_adds_removes_and_an_outage(tmp_path, connection):
    folder = tmp_path / "notes"
    folder.mkdir()
    collection = Collection("notes", folder, lambda f, s: MilvusLiveIndex(f, s, connection))
    milvus = connection.collections[collection.index.milvus.name]
    for i in range(4):
        assert collection.add_file(f"doc{i}.md", fake_content(f"doc{i}.md", 0), approx_tokens,
                                   fake_embed).status == Added.ADDED
    pids, vectors = collection.store.vectors()
    assert sorted(milvus.rows) == pids.tolist()
    assert collection.size == len(pids) and collection.info()["memory_passages"] == len(pids)

    final = list(collection.stages(vectors[0], 3, (4, 16), 4))[-1]
    assert final.rows == collection.exact(vectors[0], 3)

    removed, count = collection.remove(["doc1.md"])
    assert removed == ["doc1.md"] and count > 0
    assert sorted(milvus.rows) == collection.store.vectors()[0].tolist()
    # The removed passages were never sealed: none of them is counted as unsealed any more, nor as sealed.
    info = collection.info()
    assert (info["memory_passages"], info["disk_passages"]) == (collection.size, 0)

    connection.down(True)                      # Milvus goes away: the write is committed, the call says so
    with pytest.raises(RetrieverUnavailable, match="committed to the collection"):
        collection.add_file("late.md", fake_content("late.md", 0), approx_tokens, fake_embed)
    with pytest.raises(RetrieverUnavailable, match=r"milvus\.invalid"):
        list(collection.stages(vectors[0], 3, (4, 16), 4))
    assert collection.index.needs_merge()
    with pytest.raises(RetrieverUnavailable):
        collection.index.merge()
    connection.down(False)                     # back: the merger reconciles Milvus with the store
    assert collection.index.merge()
    assert sorted(milvus.rows) == collection.store.vectors()[0].tolist()
    assert not collection.index.needs_merge() and milvus.flushes == 1
    assert collection.info()["memory_passages"] == 0


def test_opening_reconciles_milvus_with_the_store_both_ways(tmp_path, connection):
    folder = tmp_path / "notes"
    folder.mkdir()
    collection = Collection("notes", folder, lambda f, s: MilvusLiveIndex(f, s, connection))
    for i in range(3):
        collection.add_file(f"doc{i}.md", fake_content(f"doc{i}.md", 0), approx_tokens, fake_embed)
    milvus = connection.collections[collection.index.milvus.name]
    pids = collection.store.vectors()[0].tolist()
    lost = milvus.rows.pop(pids[0])            # an insert Milvus lost, and a row the store no longer has
    milvus.rows[10_000 + pids[-1]] = lost
    collection.close()
    reopened = Collection("notes", folder, lambda f, s: MilvusLiveIndex(f, s, connection))
    assert reopened.index.milvus.name == collection.index.milvus.name      # the name is kept in the store
    assert sorted(milvus.rows) == pids


async def test_retrieve_streams_staged_updates_and_ends_unavailable_when_milvus_is_down(tmp_path, connection):
    registry = CollectionRegistry(tmp_path / "collections", DefaultCollection(),
                                  index_factory=lambda f, s: MilvusLiveIndex(f, s, connection))
    backend = MilvusAnnsBackend(registry, connection, schedule=(4, 16, 64), beam_width=4,
                                embed_query=lambda text: fake_embed([SimpleNamespace(text=text)])[0])
    collection = registry.create("notes")
    for i in range(6):
        collection.add_file(f"doc{i}.md", fake_content(f"doc{i}.md", 0), approx_tokens, fake_embed)
    query = collection.store.passages(collection.store.vectors()[0].tolist()[:1])
    text = next(iter(query.values())).text
    try:
        async with serving_retriever(backend, "anns") as served:
            stub = served.retriever
            request = pb.RetrieveRequest(query=text, top_k=3, collection="notes", options={"measure_recall": "true"})
            chunks = [r.chunk async for r in stub.Retrieve(request)]
            assert all(c.mode == pb.CHUNK_MODE_UPDATE for c in chunks) and chunks[-1].final
            assert chunks[-1].stage.search_list_size == 64 and chunks[-1].stage.recall_at_k == 1.0
            assert chunks[-1].documents[0].text == text

            bad = pb.RetrieveRequest(query=text, collection="notes", options={"l_schedule": "64,16"})
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                [r async for r in stub.Retrieve(bad)]
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT

            connection.down(True)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                [r async for r in stub.Retrieve(request)]
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "Milvus at http://milvus.invalid:19530 failed searching" in caught.value.details()
            assert backend.describe().facts["backend"] == "milvus"
    finally:
        registry.close()


def test_serve_refuses_a_missing_or_unreachable_milvus_with_one_line(tmp_path):
    import argparse

    from retriever_svc.server_args import add_retriever_args

    parser = argparse.ArgumentParser()
    add_retriever_args(parser)
    args = parser.parse_args(["--kind", "anns", "--backend", "milvus", "--index", "none",
                              "--collections", str(tmp_path)])
    with pytest.raises(SystemExit, match="--milvus-uri"):
        build_backend(args)
    args.milvus_uri, args.milvus_timeout = "http://127.0.0.1:9", 0
    with pytest.raises(SystemExit, match="--milvus-timeout must be positive"):
        build_backend(args)
    args.milvus_timeout = 1.0
    with pytest.raises(SystemExit, match=r"error: Milvus at http://127.0.0.1:9 failed connecting"):
        build_backend(args)


def test_a_milvus_slower_than_the_timeout_ends_the_search_unavailable(monkeypatch):
    connection = MilvusConnection(MilvusSettings("http://slow.invalid:19530", "HNSW", timeout_s=0.2))
    monkeypatch.setattr(connection, "connect", lambda: connection)
    collection = FakeMilvusCollection("HNSW")
    monkeypatch.setattr(milvus_index.MilvusIndex, "_open", lambda index: collection)
    index = milvus_index.MilvusIndex(connection, "c")
    index.insert([1, 2], np.stack([unit(1), unit(2)]))
    collection.delay_s = 2.0                   # pymilvus would keep retrying a server that went away
    with pytest.raises(RetrieverUnavailable, match=r"did not answer searching c within 0\.2 s"):
        index.search(unit(1), 1, 16)
