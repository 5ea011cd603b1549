"""Black-box tests of the Sessions service through real gRPC with the real model (fp32): a session
query answers exactly like Generate on the same instructions, retained data and question (before
and after retention drops data) while computing only its question; Flash answers arrive by
Subscribe and answer matching queries; every bad input gets its status; nothing leaks."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from inference_svc.engine.request import Segment
from inference_svc.native.sessions import SessionFormat
from protos import common_pb2, inference_pb2, sessions_pb2, sessions_pb2_grpc
from tests.support.inference import RunningInference
from tests.support.inference_calls import collect

INSTRUCTIONS = "You answer questions about the server log below. Answer briefly."
LOG = [
    "09:00 web-1 started, version 2.4.1",
    "09:05 web-1 health check ok",
    "09:10 db-1 replication lag 3 s",
    "09:15 web-2 started, version 2.4.2",
]
QUESTION = "Which version did web-2 start with?"


@pytest.fixture(scope="module")
def service(embedded_model_dir):
    running = RunningInference(embedded_model_dir, token_budget=256, policy="fcfs", kv_device_blocks=256,
                               kv_cpu_blocks=256)
    running.sessions = sessions_pb2_grpc.SessionsStub(running.channel)
    info = running.stub.Describe(inference_pb2.DescribeRequest(), timeout=30).model_info.chat_format
    running.fmt = SessionFormat(info.prompt_prefix + info.user_prefix, info.user_suffix + info.assistant_prefix)
    yield running
    running.stop()


def proto(segment: Segment) -> common_pb2.Segment:
    return common_pb2.Segment(text=segment.text)


def generate(service, lines, question, max_tokens=8):
    fmt = service.fmt
    segments = [fmt.head(INSTRUCTIONS), *(fmt.data(Segment(text=line)) for line in lines), fmt.query(question)]
    request = inference_pb2.GenerateRequest(segments=[proto(s) for s in segments],
                                            sampling=common_pb2.SamplingParams(max_tokens=max_tokens))
    return collect(service.stub.Generate(request, timeout=300))


def ingest(service, session_id, *batches):
    messages = [sessions_pb2.IngestRequest(session_id=session_id,
                                           segments=[common_pb2.Segment(text=t) for t in batch]) for batch in batches]
    return service.sessions.Ingest(iter(messages), timeout=60)


def query(service, session_id, question, max_tokens=8):
    request = sessions_pb2.QueryRequest(session_id=session_id, question=question,
                                        sampling=common_pb2.SamplingParams(max_tokens=max_tokens))
    started, tokens, done = None, [], None
    for response in service.sessions.Query(request, timeout=300):
        kind = response.WhichOneof("kind")
        if kind == "started":
            started = response.started
        elif kind == "token":
            tokens.append(response.token.id)
        else:
            done = response.done
    return started, tokens, done


def describe(service, session_id):
    return service.sessions.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=session_id),
                                            timeout=30).session


def wait_ready(service, session_id, timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while True:
        info = describe(service, session_id)
        if info.state == "ready":
            return info
        assert time.monotonic() < deadline, f"session never became ready: {info}"
        time.sleep(0.05)


def close(service, session_id):
    return service.sessions.CloseSession(sessions_pb2.CloseSessionRequest(session_id=session_id), timeout=30).session


def test_a_session_query_answers_like_generate_and_computes_only_its_question(service):
    service.sessions.CreateSession(sessions_pb2.CreateSessionRequest(session_id="log", instructions=INSTRUCTIONS),
                                   timeout=60)
    response = ingest(service, "log", LOG[:2], LOG[2:])
    assert (response.data_version, response.batches, response.segments) == (2, 2, 4)
    info = wait_ready(service, "log")
    assert info.computed_tokens == info.head_tokens + info.data_tokens
    assert service.stats().num_sessions == 1
    started, tokens, done = query(service, "log", QUESTION)
    assert tokens == generate(service, LOG, QUESTION).tokens
    assert started.data_version == done.data_version == 2 and not started.flash_hit
    assert started.shared_tokens == started.context_tokens == info.head_tokens + info.data_tokens
    assert done.stats.tokens_computed < 40          # the question and the answer, not the log
    assert done.confidence > 0
    close(service, "log")
    service.wait_until_all_blocks_free()


def test_queries_run_while_data_is_ingested_and_each_reports_its_version(service):
    service.sessions.CreateSession(sessions_pb2.CreateSessionRequest(session_id="busy", instructions=INSTRUCTIONS),
                                   timeout=60)
    ingest(service, "busy", LOG[:2])
    wait_ready(service, "busy")
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, query(service, "busy", QUESTION)))
               for i in range(2)]
    for thread in threads:
        thread.start()
    ingest(service, "busy", LOG[2:])
    for thread in threads:
        thread.join(timeout=300)
    for started, tokens, _ in results.values():
        expected = generate(service, LOG if started.data_version == 2 else LOG[:2], QUESTION)
        assert tokens == expected.tokens
    close(service, "busy")
    service.wait_until_all_blocks_free()


def test_retention_drops_the_oldest_data_and_answers_stay_exact(service):
    service.sessions.CreateSession(sessions_pb2.CreateSessionRequest(
        session_id="short", instructions=INSTRUCTIONS, retention_tokens=40), timeout=60)
    response = ingest(service, "short", LOG[:2], LOG[2:])
    assert response.dropped_segments >= 1
    info = wait_ready(service, "short")
    kept = LOG[-info.segments:]
    started, tokens, _ = query(service, "short", QUESTION)
    assert started.data_version == 2
    assert tokens == generate(service, kept, QUESTION).tokens
    close(service, "short")
    service.wait_until_all_blocks_free()


def test_flash_answers_are_pushed_to_subscribers_and_answer_matching_queries(service):
    service.sessions.CreateSession(sessions_pb2.CreateSessionRequest(session_id="flash", instructions=INSTRUCTIONS),
                                   timeout=60)
    registered = service.sessions.RegisterFlashQuery(
        sessions_pb2.RegisterFlashQueryRequest(session_id="flash", question=QUESTION, max_tokens=8), timeout=30)
    assert list(registered.questions) == [QUESTION]
    stream = service.sessions.Subscribe(sessions_pb2.SubscribeRequest(session_id="flash"), timeout=300)
    events = []
    reader = threading.Thread(target=lambda: events.extend(response.event for response in stream))
    reader.start()
    time.sleep(0.5)                   # the subscription is in place before the data arrives
    ingest(service, "flash", LOG)
    deadline = time.monotonic() + 300
    while not any(e.WhichOneof("kind") == "flash_ready" for e in events):
        assert time.monotonic() < deadline, events
        time.sleep(0.05)
    flash = next(e.flash_ready for e in events if e.WhichOneof("kind") == "flash_ready")   # the first answer
    expected = generate(service, LOG, QUESTION)
    assert flash.answer == expected.text and flash.data_version == 1, (flash.confidence, expected.tokens)
    started, tokens, done = query(service, "flash", "  which VERSION did web-2 start with? ")
    assert started.flash_hit and done.flash_hit and done.text == expected.text and not tokens
    registry = service.service.metrics.registry
    assert registry.get_sample_value("streamrag_session_queries_total", {"answer": "flash"}) >= 1
    assert registry.get_sample_value("streamrag_flash_answers_total") >= 1
    close(service, "flash")
    reader.join(timeout=30)
    kinds = [e.WhichOneof("kind") for e in events]
    assert kinds[0] == "data_updated" and kinds[-1] == "closed"
    service.wait_until_all_blocks_free()


def test_closing_a_session_ends_its_running_query_with_aborted(service):
    service.sessions.CreateSession(sessions_pb2.CreateSessionRequest(session_id="gone", instructions=INSTRUCTIONS),
                                   timeout=60)
    ingest(service, "gone", LOG)
    outcome = {}

    def ask():
        try:
            query(service, "gone", QUESTION, max_tokens=400)
        except grpc.RpcError as exc:
            outcome["code"], outcome["details"] = exc.code(), exc.details()

    thread = threading.Thread(target=ask)
    thread.start()
    deadline = time.monotonic() + 120
    while describe(service, "gone").active_queries == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    close(service, "gone")
    thread.join(timeout=120)
    assert outcome["code"] is grpc.StatusCode.ABORTED and "closed" in outcome["details"]
    service.wait_until_all_blocks_free()


def test_a_client_leaving_mid_query_frees_its_blocks(service):
    service.sessions.CreateSession(sessions_pb2.CreateSessionRequest(session_id="left", instructions=INSTRUCTIONS),
                                   timeout=60)
    ingest(service, "left", LOG)
    call = service.sessions.Query(sessions_pb2.QueryRequest(
        session_id="left", question=QUESTION, sampling=common_pb2.SamplingParams(max_tokens=400)), timeout=300)
    for response in call:
        if response.WhichOneof("kind") == "token":
            break
    call.cancel()
    deadline = time.monotonic() + 60
    while describe(service, "left").active_queries:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    close(service, "left")
    service.wait_until_all_blocks_free()


@pytest.mark.parametrize("call, code", [
    (lambda s: s.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="nope")), grpc.StatusCode.NOT_FOUND),
    (lambda s: s.CloseSession(sessions_pb2.CloseSessionRequest(session_id="nope")), grpc.StatusCode.NOT_FOUND),
    (lambda s: list(s.Query(sessions_pb2.QueryRequest(session_id="nope", question="q?"))), grpc.StatusCode.NOT_FOUND),
    (lambda s: s.CreateSession(sessions_pb2.CreateSessionRequest(session_id="bad", instructions="x")),
     grpc.StatusCode.ALREADY_EXISTS),
    (lambda s: s.CreateSession(sessions_pb2.CreateSessionRequest(session_id="big", retention_tokens=10**7)),
     grpc.StatusCode.RESOURCE_EXHAUSTED),
    (lambda s: s.CreateSession(sessions_pb2.CreateSessionRequest(session_id="x" * 300)),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda s: list(s.Query(sessions_pb2.QueryRequest(session_id="bad", question=" "))),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda s: list(s.Query(sessions_pb2.QueryRequest(
        session_id="bad", question="q?", sampling=common_pb2.SamplingParams(temperature=-1)))),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda s: s.Ingest(iter([sessions_pb2.IngestRequest(segments=[common_pb2.Segment(text="x")])])),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda s: s.Ingest(iter([sessions_pb2.IngestRequest(session_id="bad", segments=[common_pb2.Segment(text=" ")])])),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda s: s.Ingest(iter([])), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda s: s.UnregisterFlashQuery(sessions_pb2.UnregisterFlashQueryRequest(session_id="bad", question="never")),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda s: list(s.Subscribe(sessions_pb2.SubscribeRequest(session_id="nope"))), grpc.StatusCode.NOT_FOUND),
])
def test_bad_input_gets_its_status(service, call, code):
    listed = service.sessions.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=30).sessions
    if "bad" not in {s.session_id for s in listed}:
        service.sessions.CreateSession(sessions_pb2.CreateSessionRequest(session_id="bad", instructions="x"),
                                       timeout=60)
    with pytest.raises(grpc.RpcError) as caught:
        call(service.sessions)
    assert caught.value.code() is code, caught.value.details()


def test_too_many_sessions_is_resource_exhausted_and_shutdown_frees_every_block(embedded_model_dir):
    running = RunningInference(embedded_model_dir, kv_device_blocks=128, kv_cpu_blocks=64)
    stub = running.sessions = sessions_pb2_grpc.SessionsStub(running.channel)
    try:
        for i in range(2):
            stub.CreateSession(sessions_pb2.CreateSessionRequest(session_id=f"s{i}", instructions="x",
                                                                 retention_tokens=1200), timeout=60)
        with pytest.raises(grpc.RpcError) as caught:
            stub.CreateSession(sessions_pb2.CreateSessionRequest(session_id="s2", retention_tokens=1200), timeout=60)
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        ingest(running, "s0", LOG)
    finally:
        running.stop()
    kv = running.service.engine.scheduler.kv
    kv.check_invariants()
    assert kv.device.num_free == kv.device.num_blocks and not running.service.sessions.sessions


def test_a_session_swapped_out_by_a_long_prompt_still_answers_like_generate(embedded_model_dir):
    """48 device blocks of 16 tokens: a 730-token Generate needs more than the session leaves, so the idle
    session's KV is evicted (swapped or dropped, as the cost model says); its next query must
    still answer exactly."""
    running = RunningInference(embedded_model_dir, kv_device_blocks=48, kv_cpu_blocks=64, token_budget=256)
    running.sessions = sessions_pb2_grpc.SessionsStub(running.channel)
    info = running.stub.Describe(inference_pb2.DescribeRequest(), timeout=30).model_info.chat_format
    running.fmt = SessionFormat(info.prompt_prefix + info.user_prefix, info.user_suffix + info.assistant_prefix)
    try:
        running.sessions.CreateSession(sessions_pb2.CreateSessionRequest(
            session_id="idle", instructions=INSTRUCTIONS, retention_tokens=100), timeout=60)
        ingest(running, "idle", LOG[:2])
        wait_ready(running, "idle")
        filler = inference_pb2.GenerateRequest(segments=[common_pb2.Segment(text="word " * 730)],
                                               sampling=common_pb2.SamplingParams(max_tokens=2))
        collect(running.stub.Generate(filler, timeout=300))
        counters = running.stats().counters
        assert counters.preemptions_swap + counters.preemptions_recompute >= 1
        _, tokens, _ = query(running, "idle", QUESTION)
        assert tokens == generate(running, LOG[:2], QUESTION).tokens
        close(running, "idle")
        running.wait_until_all_blocks_free()
    finally:
        running.stop()
