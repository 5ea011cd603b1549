"""The API tells the truth about context (issue 42), through the gateway with the `openai` package.

An ANNS retriever whose default index is still building (a real build, held after its first
commit) sits behind an orchestrator of its own, beside the stack's crawler, replica and Redis:
- a `streamrag-rag` chat that leaves the retriever unsaid gets its sources from the crawler, and
  the warning in the final chunk's `streamrag.warnings` and in `X-Streamrag-Warning` headers;
- one that names `anns` gets no substitution: no sources, and a warning that says why;
- once the build is done, the ANNS retriever answers again, with no warning.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from gateway.app import GatewaySettings
from gateway.protocol import RAG_MODEL
from protos import orchestrator_pb2
from retriever_svc.anns.backend import AnnsBackend
from retriever_svc.anns.index import AnnsIndex
from retriever_svc.collections.registry import CollectionRegistry, DefaultCollection
from retriever_svc.corpus.index import build_index
from tests.support.gateway import RunningGateway
from tests.support.stack import ask
from tests.support.tiny_corpus import build_guide_pages

QUESTION = "How do I read a file?"


@dataclass
class Building:
    gateway: RunningGateway
    stub: object                      # the orchestrator's
    default: DefaultCollection
    release: threading.Event
    thread: threading.Thread


@pytest.fixture(scope="module")
def building(gateway_stack, tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("building")
    site = build_guide_pages(root / "guide")
    release = threading.Event()

    def held_build(report) -> AnnsIndex:
        def progress(state: str) -> None:
            report(state)
            if state.startswith("embed ") and not state.startswith("embed 0/"):
                release.wait(600)          # still building until the test lets it finish

        return AnnsIndex(build_index(site, root / "index", progress=False, threads=1, say=lambda _: None,
                                     on_progress=progress, commit_every=4).out)

    default = DefaultCollection()
    anns = gateway_stack.serve_retriever("anns-building", AnnsBackend(
        CollectionRegistry(root / "collections", default), schedule=(16, 64), beam_width=4))
    thread = default.build_in_background(held_build)
    orchestrator = gateway_stack.orchestrate({"anns": anns, "crawler": gateway_stack.retriever_addresses["crawler"]})
    gateway = RunningGateway(GatewaySettings(orchestrator=orchestrator.address))
    while not default.progress.startswith("embed ") or default.progress.startswith("embed 0/"):
        assert thread.is_alive(), default.error
        thread.join(0.05)
    try:
        yield Building(gateway, orchestrator.stub, default, release, thread)
    finally:
        release.set()
        gateway.stop()
        orchestrator.stop()


@pytest.fixture
def building_client(building):
    with openai.OpenAI(base_url=f"{building.gateway.base_url}/v1", api_key="not-needed", max_retries=0,
                       timeout=180) as client:
        yield client


def test_a_rag_chat_during_the_build_gets_crawler_sources_and_the_warning_in_the_final_chunk(building_client):
    raw = building_client.chat.completions.with_raw_response.create(
        model=RAG_MODEL, max_tokens=8, stream=True, messages=[{"role": "user", "content": QUESTION}])
    chunks = list(raw.parse())
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    extension = final.model_extra["streamrag"]
    assert extension["sources"] and {s["source"] for s in extension["sources"]} == {"crawler"}
    [warning] = extension["warnings"]
    assert "default ANNS index is still building" in warning and "from the crawler instead" in warning
    assert raw.headers.get_list("x-streamrag-warning") == [warning]
    assert not any(c.model_extra.get("streamrag") for c in chunks if c is not final)


def test_a_non_streamed_rag_chat_has_the_warning_in_its_body_and_header(building_client):
    raw = building_client.chat.completions.with_raw_response.create(
        model=RAG_MODEL, max_tokens=6, messages=[{"role": "user", "content": QUESTION}])
    extension = raw.parse().model_extra["streamrag"]
    assert {s["source"] for s in extension["sources"]} == {"crawler"}
    assert len(extension["warnings"]) == 1 and "still building" in extension["warnings"][0]
    assert raw.headers.get_list("x-streamrag-warning") == extension["warnings"]


def test_a_chat_that_names_anns_gets_no_substitution_and_a_warning_that_says_why(building_client):
    response = building_client.chat.completions.create(
        model=RAG_MODEL, max_tokens=6, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"retrieval": {"retriever": "anns"}})
    extension = response.model_extra["streamrag"]
    assert extension["sources"] == []
    assert extension["warnings"] and all("retriever anns failed" in w for w in extension["warnings"])
    assert "still building" in extension["warnings"][0]


def test_the_orchestrator_says_it_before_the_first_token_and_names_the_retriever_used(building):
    events, done = ask(building.stub, QUESTION, orchestrator_pb2.RETRIEVER_CHOICE_UNSPECIFIED, max_tokens=4)
    kinds = [e.WhichOneof("kind") for e in events]
    assert events[0].started.retriever == orchestrator_pb2.RETRIEVER_CHOICE_CRAWLER
    assert kinds.index("warning") < kinds.index("token")
    assert [e.warning for e in events if e.WhichOneof("kind") == "warning"] == list(done.warnings)
    assert done.sources and {s.source for s in done.sources} == {"crawler"}


def test_once_the_index_is_built_the_implicit_choice_is_anns_again_with_no_warning(building, building_client):
    building.release.set()
    building.thread.join(300)
    assert building.default.index is not None, building.default.error
    response = building_client.chat.completions.create(
        model=RAG_MODEL, max_tokens=6, messages=[{"role": "user", "content": "How do I sort lists?"}])
    extension = response.model_extra["streamrag"]
    assert extension["sources"] and {s["source"] for s in extension["sources"]} == {"anns"}
    assert extension["warnings"] == []
