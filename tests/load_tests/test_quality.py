"""`streamrag bench quality`: the question set, page matching, one Ask's outcome, the summary."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from load_tests.quality import (
    AskOutcome,
    Question,
    add_bench_quality_args,
    answers,
    ask_one,
    load_questions,
    page_of,
    render,
    run_bench_quality,
    summarize,
)
from protos import common_pb2, orchestrator_pb2, orchestrator_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = REPO / "load_tests" / "quality_questions.jsonl"
DOCS = Path("/usr/share/doc/python3.11/html")


def test_the_committed_question_set_is_large_and_spread_over_the_docs() -> None:
    questions = load_questions(QUESTIONS)
    assert len(questions) >= 40
    sections = Counter(q.section for q in questions)
    assert set(sections) == {"library", "tutorial", "howto", "reference"} and min(sections.values()) >= 10
    assert all(page.split("/")[0] in sections for q in questions for page in q.pages)
    if DOCS.is_dir():
        assert all((DOCS / page).is_file() for q in questions for page in q.pages)


def test_a_malformed_question_file_names_the_line(tmp_path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "question": "Q?", "pages": ["x.html"]}\n{"id": "b", "question": "R?"}\n')
    with pytest.raises(ValueError, match=":2:"):
        load_questions(path)
    path.write_text('{"id": "a", "question": "Q?", "pages": ["x.html"]}\n' * 2)
    with pytest.raises(ValueError, match="repeat"):
        load_questions(path)


def test_sources_match_pages_whatever_the_host_or_anchor() -> None:
    assert page_of("http://127.0.0.1:8865/library/json.html#json.dumps") == "library/json.html"
    assert page_of("library/json.html#basic-usage") == "library/json.html"
    assert answers("http://corpus:8765/docs/library/json.html", ["library/json.html"])
    assert not answers("http://h/library/json.html", ["library/pickle.html"])
    assert not answers("http://h/library/simplejson.html", ["library/json.html"])


def event(**kind) -> orchestrator_pb2.AskResponse:
    return orchestrator_pb2.AskResponse(event=orchestrator_pb2.AskEvent(**kind))


class FakeOrchestrator(orchestrator_pb2_grpc.OrchestratorServicer):
    """Streams two retrieval events (the answering page arrives in the second) and a done."""

    def __init__(self) -> None:
        self.requests: list[orchestrator_pb2.AskRequest] = []

    def Ask(self, request, context):
        self.requests.append(request)
        doc = lambda url: common_pb2.Document(id=url, url=url)  # noqa: E731
        yield event(retrieval=orchestrator_pb2.RetrievalProgress(
            documents=[doc("http://c/index.html")], elapsed_s=0.5, source="crawler"))
        yield event(lifecycle=common_pb2.LifecycleEvent(
            kind=common_pb2.LIFECYCLE_EVENT_KIND_ERROR, detail="retriever anns: down"))
        yield event(retrieval=orchestrator_pb2.RetrievalProgress(
            documents=[doc("http://c/library/json.html")], elapsed_s=1.25, final=True, source="crawler"))
        yield event(done=orchestrator_pb2.AskDone(
            sources=[doc("http://c/index.html"), doc("http://c/library/json.html")], ttft_from_question_s=2.0,
            stats=common_pb2.RequestStats(num_appends=2, prompt_tokens=300)))


@pytest.fixture
def orchestrator():
    fake = FakeOrchestrator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    orchestrator_pb2_grpc.add_OrchestratorServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake, f"127.0.0.1:{port}"
    server.stop(0)


def test_one_ask_records_rank_times_and_errors(orchestrator) -> None:
    fake, address = orchestrator
    question = Question("q1", "library", "How do I write JSON?", ("library/json.html",))
    with grpc.insecure_channel(address) as channel:
        outcome = ask_one(orchestrator_pb2_grpc.OrchestratorStub(channel), question, "crawler", top_k=5,
                          max_tokens=1, deadline_ms=0, timeout_s=10)
    assert fake.requests[0].retriever == orchestrator_pb2.RETRIEVER_CHOICE_CRAWLER and fake.requests[0].top_k == 5
    assert outcome.sources == ["index.html", "library/json.html"] and outcome.hit_rank == 2
    assert (outcome.first_relevant_s, outcome.last_chunk_s, outcome.chunks) == (1.25, 1.25, 2)
    assert outcome.error == "retriever anns: down" and outcome.ttft_s == 2.0 and outcome.finished
    assert (outcome.num_appends, outcome.prompt_tokens) == (2, 300)


def test_summary_counts_hits_at_each_k_and_times_of_hits_only() -> None:
    outcomes = [AskOutcome("a", "library", "crawler", hit_rank=1, first_relevant_s=1.0, last_chunk_s=5.0),
                AskOutcome("b", "howto", "crawler", hit_rank=4, first_relevant_s=3.0, last_chunk_s=7.0),
                AskOutcome("c", "howto", "crawler", hit_rank=None, last_chunk_s=9.0, error="retriever crawler: x"),
                AskOutcome("a", "library", "anns", hit_rank=2, first_relevant_s=0.1, last_chunk_s=0.2)]
    summary = summarize(outcomes, [1, 3, 5])
    crawler = summary["crawler"]
    assert crawler["asks"] == 3 and crawler["errors"] == 1 and crawler["cut_by_deadline"] == 2
    assert crawler["hit_at"] == {"1": pytest.approx(1 / 3, abs=1e-4), "3": pytest.approx(1 / 3, abs=1e-4),
                                 "5": pytest.approx(2 / 3, abs=1e-4)}
    assert crawler["first_relevant_chunk_s"]["p50"] == 2.0 and crawler["last_chunk_s"]["p50"] == 7.0
    assert crawler["sections"] == {"library": {"asks": 1, "hit_at_5": 1.0}, "howto": {"asks": 2, "hit_at_5": 0.5}}
    assert summary["anns"]["hit_at"]["1"] == 0.0 and summary["anns"]["hit_at"]["3"] == 1.0
    table = render(summary, [1, 3, 5])
    assert "| crawler | 3 | 33% | 33% | 67% | 2.00 / 2.80 | 7.00 / 8.60 | 2 | 1 |" in table


def test_the_command_writes_every_ask_and_the_summary(orchestrator, tmp_path, capsys) -> None:
    _, address = orchestrator
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "q1", "section": "library", "question": "JSON?",
                                     "pages": ["library/json.html"]}) + "\n")
    parser = argparse.ArgumentParser()
    add_bench_quality_args(parser)
    out = tmp_path / "quality.json"
    args = parser.parse_args(["--questions", str(questions), "--orchestrator", address, "--json", str(out),
                              "--retrievers", "anns,crawler"])
    assert run_bench_quality(args) == 1                          # the fake reports a retriever error
    result = json.loads(out.read_text())
    assert [a["retriever"] for a in result["asks"]] == ["anns", "crawler"]
    assert result["summary"]["crawler"]["hit_at"]["5"] == 1.0
    assert "| anns | 1 |" in capsys.readouterr().out
    bad = parser.parse_args(["--questions", str(questions), "--retrievers", "web"])
    assert run_bench_quality(bad) == 2
