"""The ANNS retriever over real DiskANN indexes, behind a real grpc.aio Retriever server on loopback.

Server and client share the test's event loop. The tiny corpus index (five passages) checks
the contract and the answers; an index of random vectors, where small search lists miss
neighbours, checks that recall never drops from one stage to the next.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from itertools import pairwise
from pathlib import Path

import grpc
import numpy as np
import pytest

from protos import retriever_pb2
from retriever_svc.anns.backend import AnnsBackend, build_backend, parse_schedule
from retriever_svc.anns.index import AnnsIndex, recall
from retriever_svc.server_args import add_retriever_args
from retriever_svc.stages import effective_schedule
from tests.retriever import build_random_index, build_tiny_index
from tests.support.retrievers import serving_retriever

UPDATE = retriever_pb2.CHUNK_MODE_UPDATE


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory) -> Path:
    return build_tiny_index(tmp_path_factory.mktemp("anns-tiny"))


@pytest.fixture(scope="module")
def random_index(tmp_path_factory) -> Path:
    return build_random_index(tmp_path_factory.mktemp("anns-random"))


@pytest.fixture
def tiny_backend(tiny_index) -> AnnsBackend:
    backend = AnnsBackend(AnnsIndex(tiny_index), schedule=(2, 3, 4, 5), beam_width=4)
    yield backend
    backend.index.close()


async def retrieve(stub, query: str, top_k: int = 3, **options: str) -> list[retriever_pb2.ContextChunk]:
    request = retriever_pb2.RetrieveRequest(query=query, top_k=top_k, options=options)
    return [response.chunk async for response in stub.Retrieve(request)]


async def test_retrieve_streams_full_update_lists_with_stages_and_one_final(tiny_backend):
    async with serving_retriever(tiny_backend, "anns") as served:
        stub = served.retriever
        chunks = await retrieve(stub, "How do I read a file?", top_k=3, l_schedule="1,2,4,8", measure_recall="true")
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert all(c.mode == UPDATE for c in chunks)
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    stages = [(c.stage.index, c.stage.search_list_size) for c in chunks]
    assert stages == sorted(stages) and stages[-1] == (2, 8)         # effective schedule: 3, 4, 8
    assert stages[0][1] == 3
    for chunk in chunks:
        assert len(chunk.documents) == 3 and len({d.id for d in chunk.documents}) == 3
        assert all(d.source == "anns" and d.text and d.title and d.url for d in chunk.documents)
        assert [d.score for d in chunk.documents] == sorted((d.score for d in chunk.documents), reverse=True)
        assert chunk.stage.HasField("recall_at_k")
    recalls = [c.stage.recall_at_k for c in chunks]
    assert recalls == sorted(recalls) and recalls[-1] == 1.0
    assert chunks[-1].documents[0].url == "files.html"
    assert all(c.emitted_unix_ms > 0 for c in chunks)


async def test_top_k_above_the_corpus_size_returns_each_passage_once(tiny_backend):
    async with serving_retriever(tiny_backend, "anns") as served:
        stub = served.retriever
        chunks = await retrieve(stub, "What does get() return when a key is missing?", top_k=10)
    assert chunks[-1].final and not chunks[-1].stage.HasField("recall_at_k")
    assert len({d.id for d in chunks[-1].documents}) == 5 == len(chunks[-1].documents)
    assert chunks[-1].documents[0].url == "dicts.html"


async def test_describe_reports_kind_corpus_and_index_facts(tiny_backend):
    async with serving_retriever(tiny_backend, "anns") as served:
        stub = served.retriever
        info = (await stub.Describe(retriever_pb2.RetrieverDescribeRequest())).retriever_info
    assert info.kind == retriever_pb2.RETRIEVER_KIND_ANNS
    assert info.corpus == "site" and info.num_documents == 5
    assert info.facts["embedding_model"] == "all-MiniLM-L6-v2" and info.facts["dim"] == "384"
    assert info.facts["search_list_sizes"] == "2,3,4,5" and info.facts["beam_width"] == "4"


BAD_REQUESTS = [
    ({"query": ""}, "empty"),
    ({"query": "   "}, "empty"),
    ({"query": "x" * 2001}, "limit"),
    ({"query": "files", "top_k": 101}, "top_k"),
    ({"query": "files", "top_k": -1}, "top_k"),
    ({"query": "files", "deadline_ms": 10**9}, "deadline_ms"),
    ({"query": "files", "options": {"max_depth": "2"}}, "unknown options"),
    ({"query": "files", "options": {"l_schedule": "abc"}}, "l_schedule"),
    ({"query": "files", "options": {"l_schedule": "64,16"}}, "l_schedule"),
    ({"query": "files", "options": {"l_schedule": "0,8"}}, "l_schedule"),
    ({"query": "files", "options": {"l_schedule": ""}}, "l_schedule"),
    ({"query": "files", "options": {"beam_width": "0"}}, "beam_width"),
    ({"query": "files", "options": {"beam_width": "wide"}}, "beam_width"),
    ({"query": "files", "options": {"measure_recall": "maybe"}}, "measure_recall"),
]


async def test_bad_inputs_end_with_invalid_argument_and_the_service_keeps_serving(tiny_backend):
    async with serving_retriever(tiny_backend, "anns") as served:
        stub = served.retriever
        for fields, says in BAD_REQUESTS:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                async for _ in stub.Retrieve(retriever_pb2.RetrieveRequest(**fields)):
                    pass
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT, fields
            assert says in failure.value.details(), (fields, failure.value.details())
        chunks = await retrieve(stub, "How do lists work?", beam_width="2", l_schedule="3,5")
    assert chunks[-1].final and chunks[-1].documents[0].url == "lists.html"


class SlowIndex(AnnsIndex):
    """Each search takes `delay` seconds more; counts the searches started."""

    delay = 0.15

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.searches = 0

    def search(self, vector, k, search_list_size, beam_width):
        self.searches += 1
        time.sleep(self.delay)
        return super().search(vector, k, search_list_size, beam_width)


async def test_cancelling_mid_retrieval_stops_between_stages(tiny_index):
    index = SlowIndex(tiny_index)
    backend = AnnsBackend(index, schedule=tuple(range(3, 11)), beam_width=4)    # 8 stages: 1.2 s in all
    async with serving_retriever(backend, "anns") as served:
        stub = served.retriever
        call = stub.Retrieve(retriever_pb2.RetrieveRequest(query="buffered writes", top_k=3))
        first = await call.read()
        assert first.chunk.stage.index == 0 and not first.chunk.final
        call.cancel()
        await asyncio.sleep(2 * SlowIndex.delay + 0.1)
        stopped_at = index.searches
        await asyncio.sleep(3 * SlowIndex.delay)
    assert stopped_at <= 2, "a stage started after the call was cancelled"
    assert index.searches == stopped_at
    index.close()


def test_stage_recall_and_overlap_never_drop_on_a_hard_index(random_index):
    index = AnnsIndex(random_index)
    queries = np.random.default_rng(1).standard_normal((40, 384)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    schedule, k, first_recalls = (10, 12, 16, 24, 32, 64, 128), 10, []
    for vector in queries:
        exact = index.exact(vector, k)
        stages = list(index.stages(vector, k, schedule, beam_width=4))
        assert [s.search_list_size for s in stages] == list(schedule) and stages[-1].final
        recalls = [recall(s.rows, exact) for s in stages]
        overlaps = [recall(s.rows, stages[-1].rows) for s in stages]
        assert recalls == sorted(recalls) and overlaps == sorted(overlaps)
        assert [s.changed for s in stages[1:]] == [a.rows != b.rows for a, b in pairwise(stages)]
        plain, _ = index.search(vector, k, schedule[-1], beam_width=4)
        assert recalls[-1] >= recall(plain, exact)                 # the final list is at least the full-L result
        first_recalls.append(recalls[0])
    assert min(first_recalls) < 1.0, "the first stage never missed: the test index is too easy"
    index.close()


async def test_emitted_chunks_on_a_hard_index_carry_non_decreasing_recall(random_index):
    backend = AnnsBackend(AnnsIndex(random_index), schedule=(10, 16, 32, 128), beam_width=2)
    async with serving_retriever(backend, "anns") as served:
        stub = served.retriever
        for query in ("open a file", "sort a list", "dictionary keys", "buffered io", "generators"):
            chunks = await retrieve(stub, query, top_k=10, measure_recall="true")
            recalls = [c.stage.recall_at_k for c in chunks]
            assert recalls == sorted(recalls) and chunks[-1].final and chunks[-1].stage.search_list_size == 128
            emitted = [[d.id for d in c.documents] for c in chunks]
            assert all(a != b for a, b in pairwise(emitted[:-1]))   # only changes go out (and the final)
    backend.index.close()


def test_schedule_parsing_and_the_effective_schedule():
    assert parse_schedule("16, 64,256") == (16, 64, 256)
    for bad in ("", "a", "16,16", "32,16", "0", "5000"):
        with pytest.raises(ValueError):
            parse_schedule(bad)
    assert effective_schedule((2, 8, 16, 64), k=10) == [10, 16, 64]


def test_build_backend_from_the_serve_retriever_flags(tiny_index, tmp_path):
    parser = argparse.ArgumentParser()
    add_retriever_args(parser)
    args = parser.parse_args(["--kind", "anns", "--index", str(tiny_index), "--l-schedule", "4,8", "--beam-width", "2"])
    backend = build_backend(args)
    assert backend.describe().facts["search_list_sizes"] == "4,8" and backend.beam_width == 2
    backend.index.close()
    with pytest.raises(SystemExit, match="index build"):
        build_backend(parser.parse_args(["--kind", "anns", "--index", str(tmp_path / "none")]))
    with pytest.raises(SystemExit, match="l_schedule"):
        build_backend(parser.parse_args(["--kind", "anns", "--index", str(tiny_index), "--l-schedule", "8,4"]))
