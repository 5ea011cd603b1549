"""End to end through the Orchestrator: real Redis, real retrievers over the tiny corpus, the
real model. Answers stream for each retriever with streaming on and off, lifecycles land in
Redis in order, faults degrade gracefully, bad input is refused."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from protos import orchestrator_pb2
from tests.support.redis_server import PrivateRedis
from tests.support.stack import ask

ANNS = orchestrator_pb2.RETRIEVER_CHOICE_ANNS
CRAWLER = orchestrator_pb2.RETRIEVER_CHOICE_CRAWLER
REPLAY = orchestrator_pb2.RETRIEVER_CHOICE_REPLAY
QUESTION = "How do I close a file with the with statement?"
CRAWL_QUESTION = "use the with statement to close a file and flush buffered writes"


def kinds(record) -> list[str]:
    return [event.kind for event in record.events]


def assert_lifecycle_order(record) -> None:
    seen = kinds(record)
    for earlier, later in [("QUEUED", "SCHEDULED"), ("SCHEDULED", "FIRST_TOKEN"), ("FIRST_TOKEN", "FINISHED"),
                           ("FINISHED", "DONE")]:
        assert earlier in seen and later in seen, seen
        assert seen.index(earlier) < seen.index(later), seen
    assert "RETRIEVAL_CHUNK" in seen
    times = [event.unix_ms for event in record.events]
    assert times == sorted(times)


def get_record(stack, request_id: str, timeout_s: float = 30.0, until: tuple[str, ...] = ("DONE",)):
    """The store writes in the background: wait until the request's events `until` are stored."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = stack.stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=request_id), timeout=10).record
        if all(kind in kinds(record) for kind in until) or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


@pytest.mark.parametrize("no_stream", [False, True], ids=["streaming", "baseline"])
@pytest.mark.parametrize(("retriever", "question"), [(ANNS, QUESTION), (CRAWLER, CRAWL_QUESTION)],
                         ids=["anns", "crawler"])
def test_answer_streams_and_lifecycle_is_recorded(stack, retriever, question, no_stream):
    events, done = ask(stack.stub, question, retriever, no_stream=no_stream)
    assert done is not None and done.answer
    assert events[0].WhichOneof("kind") == "started"
    assert sum(e.WhichOneof("kind") == "token" for e in events) >= 1
    assert done.sources, "no documents reached the prompt"
    assert done.ttft_from_question_s >= done.ttft_from_retrieval_end_s
    record = get_record(stack, done.request_id)
    assert record.question == question
    assert orchestrator_pb2.RequestState.Name(record.state) == "REQUEST_STATE_FINISHED"
    assert record.answer == done.answer
    assert record.streamed == (not no_stream)
    assert_lifecycle_order(record)


def test_streaming_and_baseline_put_the_same_tokens_in_front_of_the_model(stack):
    _, streamed = ask(stack.stub, QUESTION, ANNS)
    _, baseline = ask(stack.stub, QUESTION, ANNS, no_stream=True)
    assert [s.id for s in streamed.sources] == [s.id for s in baseline.sources]
    assert streamed.stats.prompt_tokens == baseline.stats.prompt_tokens
    assert streamed.answer == baseline.answer          # fp32 engine: same prompt, same greedy answer


def test_a_retriever_killed_mid_stream_still_yields_an_answer(stack):
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=ask(stack.stub, "how do files work", REPLAY)))
    worker.start()
    time.sleep(1.5)                     # the replay retriever has sent its first chunk and now waits 60 s
    stack.stop_retriever("replay")
    worker.join(120)
    events, done = result["r"]
    assert done is not None and done.answer
    assert [s.id for s in done.sources] == ["r1"]
    assert any(e.WhichOneof("kind") == "lifecycle" and "retriever replay" in e.lifecycle.detail for e in events)
    record = get_record(stack, done.request_id)
    assert any(e.kind == "ERROR" and e.fields.get("source") == "replay" for e in record.events)


def test_redis_down_mid_request_loses_no_answer_and_events_arrive_after_restart(stack):
    port = stack.redis.port
    done = None
    for response in stack.stub.Ask(orchestrator_pb2.AskRequest(question=QUESTION, retriever=ANNS, max_tokens=12),
                                   timeout=120):
        if response.event.WhichOneof("kind") == "started":
            stack.redis.stop()                    # mid-request: the record exists, the answer has not begun
        if response.event.WhichOneof("kind") == "done":
            done = response.event.done
    assert done is not None and done.answer       # the answer does not depend on Redis
    with pytest.raises(grpc.RpcError) as err:
        stack.stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=done.request_id), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    stack.redis = PrivateRedis(stack.root, port=port, persist=True)
    record = get_record(stack, done.request_id, timeout_s=60, until=("DONE", "REDIS_GAP"))
    assert "DONE" in kinds(record) and "REDIS_GAP" in kinds(record)
    assert_lifecycle_order(record)


@pytest.mark.parametrize(("fields", "message"), [
    ({"question": ""}, "empty"),
    ({"question": "x" * 5000}, "limit"),
    ({"question": "q", "retriever": 99}, "retriever"),
    ({"question": "q", "max_tokens": 100000}, "max_tokens"),
    ({"question": "q", "top_k": 500}, "top_k"),
    ({"question": "q", "retrieval_deadline_ms": -5}, "deadline"),
    ({"question": "q", "request_id": "bad\nid"}, "request_id"),
])
def test_bad_ask_input_is_invalid_argument(stack, fields, message):
    with pytest.raises(grpc.RpcError) as err:
        list(stack.stub.Ask(orchestrator_pb2.AskRequest(**fields), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_get_request_for_an_unknown_id_is_not_found(stack):
    with pytest.raises(grpc.RpcError) as err:
        stack.stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id="no-such-request"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_cancelled_ask_frees_the_replicas_blocks(stack):
    call = stack.stub.Ask(orchestrator_pb2.AskRequest(question=QUESTION, retriever=ANNS, max_tokens=400,
                                                      sampling={"ignore_eos": True}), timeout=120)
    for response in call:
        if response.event.WhichOneof("kind") == "token":
            call.cancel()
            break
    stack.inference.wait_until_all_blocks_free()


def test_metrics_count_answers_and_ttfts_by_mode(stack):
    registry = stack.orchestrator.service.metrics.registry
    before = registry.get_sample_value("streamrag_asks_total", {"mode": "baseline", "outcome": "answered"}) or 0
    ask(stack.stub, QUESTION, ANNS, no_stream=True)
    assert registry.get_sample_value("streamrag_asks_total", {"mode": "baseline", "outcome": "answered"}) == before + 1
    assert registry.get_sample_value("streamrag_ask_ttft_from_question_seconds_count", {"mode": "baseline"}) >= 1
