"""Both retrievers: crawler pages merged by relevance, appends wherever possible, no page twice."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.documents import RELEVANCE_MARGIN, MergedDocuments, page_of
from protos import common_pb2, retriever_pb2


def page(doc_id: str, score: float, url: str = "") -> retriever_pb2.ContextChunk:
    url = url or f"http://corpus:8765/{doc_id}.html"
    return retriever_pb2.ContextChunk(mode=retriever_pb2.CHUNK_MODE_APPEND, documents=[
        common_pb2.Document(id=doc_id, score=score, url=url, source="crawler")])


def update(ids: list[str]) -> retriever_pb2.ContextChunk:
    return retriever_pb2.ContextChunk(mode=retriever_pb2.CHUNK_MODE_UPDATE, documents=[
        common_pb2.Document(id=i, score=0.5, url=f"anns/{i}.html#part", source="anns") for i in ids])


def ids(docs) -> list[str]:
    return [d.id for d in docs]


def test_pages_arriving_in_about_falling_relevance_are_all_appends():
    docs = MergedDocuments(by_relevance=True)
    docs.apply(update(["a1", "a2"]))
    for doc_id, score in [("p1", 0.9), ("p2", 0.7), ("p3", 0.8), ("p4", 0.4)]:   # p3 beats p2 by < margin
        action, sent = docs.apply(page(doc_id, score))
        assert action == "append" and ids(sent) == [doc_id]
    assert ids(docs.all) == ["a1", "a2", "p1", "p2", "p3", "p4"]


def test_a_clearly_more_relevant_page_goes_before_the_pages_it_beats_as_an_update():
    docs = MergedDocuments(by_relevance=True)
    docs.apply(update(["a1", "a2"]))
    docs.apply(page("p1", 0.6))
    docs.apply(page("p2", 0.3))
    action, merged = docs.apply(page("p3", 0.65))                    # beats p2 by more than the margin only
    assert action == "update"
    assert ids(merged) == ["a1", "a2", "p1", "p3", "p2"]             # ANNS passages stay in front
    assert 0.65 - 0.3 > RELEVANCE_MARGIN > 0.65 - 0.6


def test_a_page_an_anns_passage_already_brought_is_left_out():
    docs = MergedDocuments(by_relevance=True)
    docs.apply(update(["io"]))                                        # anns/io.html#part
    assert docs.apply(page("p-io", 0.9, url="http://corpus:8765/anns/io.html")) == ("none", [])
    assert docs.apply(page("p-os", 0.9, url="http://corpus:8765/anns/os.html"))[0] == "append"
    assert ids(docs.all) == ["io", "p-os"]
    assert page_of("http://h:1/library/io.html?x=1#y") == page_of("library/io.html#z") == "library/io.html"


def test_a_refinement_that_brings_a_page_a_crawl_already_did_drops_the_crawled_copy():
    docs = MergedDocuments(by_relevance=True)
    docs.apply(update(["os"]))                                        # a slow ANNS refinement comes later
    docs.apply(page("p-io", 0.9, url="http://corpus:8765/anns/io.html"))
    docs.apply(page("p-re", 0.8, url="http://corpus:8765/anns/re.html"))
    action, merged = docs.apply(update(["os", "io"]))                 # now anns/io.html#part
    assert action == "update" and ids(merged) == ["os", "io", "p-re"]


def test_without_relevance_pages_stay_in_arrival_order_and_all_are_kept():
    docs = MergedDocuments()
    docs.apply(update(["io"]))
    docs.apply(page("p1", 0.2, url="anns/io.html"))
    action, sent = docs.apply(page("p2", 0.9))
    assert action == "append" and ids(sent) == ["p2"]
    assert ids(docs.all) == ["io", "p1", "p2"]


def test_several_pages_in_one_chunk_are_sent_in_their_placed_order():
    docs = MergedDocuments(by_relevance=True)
    docs.apply(page("p1", 0.9))
    chunk = retriever_pb2.ContextChunk(mode=retriever_pb2.CHUNK_MODE_APPEND, documents=[
        common_pb2.Document(id="p2", score=0.1, url="p2.html"), common_pb2.Document(id="p3", score=0.5, url="p3.html")])
    action, sent = docs.apply(chunk)
    assert action == "append" and ids(sent) == ["p3", "p2"]


chunks = st.lists(st.one_of(
    st.tuples(st.just("update"), st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), max_size=4, unique=True)),
    st.tuples(st.just("append"), st.tuples(st.sampled_from(["p", "q", "r", "s", "t", "a"]),
                                           st.sampled_from([0.1, 0.25, 0.4, 0.4, 0.7, 0.9])))), max_size=12)


@settings(deadline=None)
@given(chunks, st.booleans())
def test_the_streamed_prompt_always_equals_the_merged_list_the_baseline_sends(sequence, by_relevance):
    docs = MergedDocuments(by_relevance=by_relevance)
    prompt: list[str] = []           # what the engine holds after each append / update
    for kind, value in sequence:
        chunk = update(value) if kind == "update" else page(*value)
        action, sent = docs.apply(chunk)
        if action == "append":
            prompt += ids(sent)
        elif action == "update":
            prompt = ids(sent)
        assert prompt == ids(docs.all)
        assert len(prompt) == len(set(prompt))
        if by_relevance:             # no page is behind one it beats by more than the margin
            scores = [d.score for d in docs.appended]
            assert all(scores[i] >= scores[j] - RELEVANCE_MARGIN - 1e-9
                       for i in range(len(scores)) for j in range(i + 1, len(scores)))
