"""The merged document list: update-mode refinements keep surviving documents in place."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.documents import MergedDocuments, stable_order
from protos import common_pb2, retriever_pb2


def update(ids: list[str]) -> retriever_pb2.ContextChunk:
    return retriever_pb2.ContextChunk(mode=retriever_pb2.CHUNK_MODE_UPDATE,
                                      documents=[common_pb2.Document(id=i) for i in ids])


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_survivors_stay_in_place_and_new_documents_follow():
    docs = MergedDocuments()
    docs.apply(update(["a", "b", "c", "d"]))
    action, merged = docs.apply(update(["c", "e", "a", "d"]))      # b dropped, e new, ranks moved
    assert action == "update"
    assert [d.id for d in merged] == ["a", "c", "d", "e"]


def test_an_unchanged_set_in_a_new_rank_order_is_no_update():
    docs = MergedDocuments()
    docs.apply(update(["a", "b", "c"]))
    assert docs.apply(update(["c", "b", "a"])) == ("none", [])


stages = st.lists(st.lists(st.sampled_from("abcdefghij"), min_size=1, max_size=6, unique=True), min_size=1,
                  max_size=6)


@settings(deadline=None)
@given(stages)
def test_each_update_holds_exactly_the_retrievers_documents_and_keeps_the_longest_possible_prefix(stages):
    docs = MergedDocuments()
    previous: list[str] = []
    for ids in stages:
        docs.apply(update(ids))
        stable = [d.id for d in docs.all]
        assert sorted(stable) == sorted(ids)
        survivors = [i for i in previous if i in ids]
        assert stable[:len(survivors)] == survivors            # survivors first, in their previous order
        # no order of these documents keeps a longer prefix of the previous list (the KV that stays valid)
        best = next((n for n, i in enumerate(previous) if i not in ids), len(previous))
        assert common_prefix(previous, stable) == best
        previous = stable


def test_stable_order_of_the_first_stage_is_its_rank_order():
    ranked = [common_pb2.Document(id=i) for i in "xyz"]
    assert [d.id for d in stable_order([], ranked)] == ["x", "y", "z"]
