"""The live index's invariants under random adds, replaces, removes, merges and reopenings: a
Hypothesis property at the `Collection` level, with random unit vectors standing in for the
model; and the disk part's searches after removals and merges racing a file's publish.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retriever_svc.collections.collection import Added, Collection
from retriever_svc.corpus.embedding import EMBEDDING_DIM
from retriever_svc.corpus.passages import approx_tokens
from tests.retriever.collections_support import (
    fake_content,
    fake_embed,
)

# ---------------------------------------------------------------- the live index's invariants

PATHS = ["a.md", "d/b.md", "d/e/c.txt", "d2/f.md", "d-x.md"]
TARGETS = ["a.md", "d", "d/", "d/e", "d/b.md", "d2", "nothing", ""]


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
    queries = np.random.default_rng(seed).standard_normal((3, EMBEDDING_DIM)).astype(np.float32)
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
    queries = np.random.default_rng(seed).standard_normal((count, EMBEDDING_DIM)).astype(np.float32)
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
