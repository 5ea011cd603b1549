"""Both retrievers end to end on the tiny corpus: crawler pages placed by relevance, the same
prompt streamed and not, and an answer from the ANNS passages when the crawler's site search is down."""

from __future__ import annotations

from orchestrator.documents import RELEVANCE_MARGIN, page_of
from protos import common_pb2, orchestrator_pb2
from tests.support.stack import ask

BOTH = orchestrator_pb2.RETRIEVER_CHOICE_BOTH
QUESTION = "use the with statement to close a file and flush buffered writes"


def test_both_retrievers_put_the_same_sources_in_front_of_the_model_streamed_or_not(stack):
    _, streamed = ask(stack.stub, QUESTION, BOTH)
    _, baseline = ask(stack.stub, QUESTION, BOTH, no_stream=True)
    assert streamed is not None and baseline is not None
    sources = [s.source for s in streamed.sources]
    assert "anns" in sources and sources == sorted(sources)        # ANNS passages first, then the pages
    passages = {page_of(s.url) for s in streamed.sources if s.source == "anns"}
    pages = [s for s in streamed.sources if s.source == "crawler"]
    assert not {page_of(s.url) for s in pages} & passages           # no page twice
    assert all(a.score >= b.score - RELEVANCE_MARGIN for i, a in enumerate(pages) for b in pages[i + 1:])
    assert [s.id for s in streamed.sources] == [s.id for s in baseline.sources]
    assert streamed.stats.prompt_tokens == baseline.stats.prompt_tokens


def test_with_the_site_search_down_both_still_answers_from_the_anns_passages(stack):
    index, stack.corpus.search_index = stack.corpus.search_index, None     # /search now answers 404
    try:
        events, done = ask(stack.stub, QUESTION, BOTH)
    finally:
        stack.corpus.search_index = index
    assert done is not None and done.answer
    assert done.sources and {s.source for s in done.sources} == {"anns"}
    errors = [e.lifecycle.detail for e in events if e.WhichOneof("kind") == "lifecycle"
              and e.lifecycle.kind == common_pb2.LIFECYCLE_EVENT_KIND_ERROR]
    assert any("retriever crawler" in d and "site search" in d and "HTTP 404" in d for d in errors), errors
