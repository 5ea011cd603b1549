"""Hostile and malformed input against the real Inference service (real model, fp32, real gRPC).

Every bad request must end with the status code the contract names (design.md section 3,
protos/inference.proto) and a message that says what was wrong; afterwards the service must
still be SERVING, still answer a small Generate exactly as before, and hold no KV blocks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference_svc.rpc.convert import MAX_REQUEST_ID_CHARS, MAX_SEGMENT_CHARS, MAX_SEGMENTS_PER_MESSAGE
from protos import common_pb2, inference_pb2
from tests.support.inference import RunningInference
from tests.support.inference_calls import Answer, append_msg, collect, finish_msg, open_msg, paced, seg, update_msg

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
VOCAB = 49152                    # SmolLM2-135M
CONTEXT_LIMIT = 8191             # min(context 8192, 512 blocks * 16) - 1: the longest prompt accepted

SMALL_PROMPT = [seg("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")]
HEAD = [seg("<|im_start|>user\nQuestion: how do I read a file in Python?\nDocuments:\n")]
DOCS = [
    seg("[files] Use open() to read a file; the with statement closes it for you.\n", "files"),
    seg("[lists] A list is a mutable sequence; append() adds an item at the end.\n", "lists"),
    seg("[io] read() returns the whole content and readline() returns one line.\n", "io"),
    seg("[paths] pathlib.Path.read_text() reads a whole file in one call.\n", "paths"),
]
SUFFIX = [seg("<|im_end|>\n<|im_start|>assistant\n")]


def ids(*token_ids: int) -> common_pb2.Segment:
    return common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=list(token_ids)))


def sampling(max_tokens: int = 8, **fields: object) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=max_tokens, **fields)


def generate_request(segments, request_id: str = "", **fields: object) -> inference_pb2.GenerateRequest:
    """`fields`: sampling fields, or request fields `policy_hint` / `sampling`."""
    policy_hint = fields.pop("policy_hint", "")
    params = fields.pop("sampling", None) or sampling(**fields)
    return inference_pb2.GenerateRequest(request_id=request_id, segments=list(segments), sampling=params,
                                         policy_hint=policy_hint)


def open_with_hint(request_id: str, segments, policy_hint: str) -> inference_pb2.StreamPromptRequest:
    message = open_msg(request_id, segments)
    message.update.open.policy_hint = policy_hint
    return message


def no_kind() -> inference_pb2.StreamPromptRequest:
    return inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate())


Call = Callable[[object], Iterator]


def via_stream(*messages: inference_pb2.StreamPromptRequest) -> Call:
    return lambda stub: stub.StreamPrompt(iter(messages), timeout=60)


def via_generate(request: inference_pb2.GenerateRequest) -> Call:
    return lambda stub: stub.Generate(request, timeout=60)


NO_CONTENT = common_pb2.Segment(key="doc-without-content")
HUGE_TEXT = seg("a" * (MAX_SEGMENT_CHARS + 1))
TOO_MANY_SEGMENTS = [seg("x")] * (MAX_SEGMENTS_PER_MESSAGE + 1)
BEYOND_CONTEXT = ids(*([42] * 9000))
THIRD_OF_CONTEXT = ids(*([42] * 3000))
TOO_LONG = "prompt too long: "   # how every too-long answer starts, whichever limit it hits
LIMIT_TEXT = f"has {MAX_SEGMENT_CHARS + 1} characters; the limit is {MAX_SEGMENT_CHARS} per segment"
RANGE_TEXT = f"token ids must be in [0, {VOCAB})"
TOO_LONG_TEXT = f"prompt too long: 9000 tokens; the limit is {CONTEXT_LIMIT}"

# (call, code, fragment of the status message); the test id names the input.
CASES = [
    # --- protocol order ---------------------------------------------------------------
    pytest.param(via_stream(append_msg(seg("doc"))), INVALID, "first message must be open, got append",
                 id="append-before-open"),
    pytest.param(via_stream(update_msg(seg("doc")), finish_msg()), INVALID, "first message must be open, got update",
                 id="update-before-open"),
    pytest.param(via_stream(finish_msg(*SMALL_PROMPT)), INVALID, "first message must be open, got finish",
                 id="finish-before-open"),
    pytest.param(via_stream(), INVALID, "empty stream", id="empty-stream"),
    pytest.param(via_stream(open_msg("after-fin-a", SMALL_PROMPT, max_tokens=64), finish_msg(),
                            append_msg(seg("late"))), INVALID, "append after finish", id="append-after-finish"),
    pytest.param(via_stream(open_msg("after-fin-u", SMALL_PROMPT, max_tokens=64), finish_msg(),
                            update_msg(seg("late"))), INVALID, "update after finish", id="update-after-finish"),
    pytest.param(via_stream(open_msg("after-fin-f", SMALL_PROMPT, max_tokens=64), finish_msg(), finish_msg()),
                 INVALID, "finish after finish", id="finish-after-finish"),
    pytest.param(via_stream(open_msg("after-fin-o", SMALL_PROMPT, max_tokens=64), finish_msg(),
                            open_msg("after-fin-o", SMALL_PROMPT)), INVALID, "open after finish",
                 id="open-after-finish"),
    pytest.param(via_stream(open_msg("two-opens", HEAD), open_msg("two-opens", HEAD), finish_msg(*SUFFIX)),
                 INVALID, "a second open is not allowed", id="two-opens"),
    pytest.param(via_stream(no_kind()), INVALID, "first message must be open, got nothing", id="no-kind-first"),
    pytest.param(via_stream(inference_pb2.StreamPromptRequest()), INVALID, "first message must be open, got nothing",
                 id="no-update-field-first"),
    pytest.param(via_stream(open_msg("no-kind-later", HEAD), no_kind(), finish_msg(*SUFFIX)), INVALID,
                 "must set open, append, update or finish", id="no-kind-later"),
    pytest.param(via_stream(open_msg("closed-early", HEAD), append_msg(*DOCS[:1])), INVALID,
                 "closed its stream before finish", id="closed-before-finish"),
    pytest.param(via_stream(open_msg("closed-after-open", HEAD)), INVALID, "closed its stream before finish",
                 id="closed-right-after-open"),
    # --- empty prompts and malformed segments ---------------------------------------------
    pytest.param(via_stream(open_msg("empty-prompt"), finish_msg()), INVALID, "the prompt is empty",
                 id="empty-prompt-stream"),
    pytest.param(via_stream(open_msg("empty-texts", [seg("")]), append_msg(seg("")), finish_msg(seg(""))), INVALID,
                 "the prompt is empty", id="empty-prompt-empty-texts"),
    pytest.param(via_generate(generate_request([])), INVALID, "the prompt is empty", id="generate-no-segments"),
    pytest.param(via_generate(generate_request([*SMALL_PROMPT, NO_CONTENT])), INVALID,
                 "segment 1 has neither text nor token_ids", id="segment-without-content-generate"),
    pytest.param(via_stream(open_msg("no-content", HEAD), append_msg(NO_CONTENT), finish_msg(*SUFFIX)), INVALID,
                 "segment 0 has neither text nor token_ids", id="segment-without-content-append"),
    pytest.param(via_generate(generate_request([*SMALL_PROMPT, ids(1, -5, 2)])), INVALID, RANGE_TEXT,
                 id="token-id-negative"),
    pytest.param(via_generate(generate_request([ids(10**9)])), INVALID, RANGE_TEXT, id="token-id-huge"),
    pytest.param(via_stream(open_msg("vocab-edge", HEAD), append_msg(ids(VOCAB)), finish_msg(*SUFFIX)), INVALID,
                 RANGE_TEXT, id="token-id-vocab-size-in-append"),
    pytest.param(via_generate(generate_request([HUGE_TEXT])), EXHAUSTED, LIMIT_TEXT, id="oversize-segment-generate"),
    pytest.param(via_stream(open_msg("huge", HEAD), append_msg(HUGE_TEXT), finish_msg(*SUFFIX)), EXHAUSTED,
                 LIMIT_TEXT, id="oversize-segment-append"),
    pytest.param(via_generate(generate_request(TOO_MANY_SEGMENTS)), EXHAUSTED,
                 f"{MAX_SEGMENTS_PER_MESSAGE + 1} segments in one message; the limit is {MAX_SEGMENTS_PER_MESSAGE}",
                 id="too-many-segments"),
    # --- sampling -------------------------------------------------------------------------
    pytest.param(via_generate(generate_request(SMALL_PROMPT, temperature=-0.5)), INVALID,
                 "temperature must be a finite number >= 0", id="negative-temperature"),
    pytest.param(via_stream(open_msg("nan-temp", SMALL_PROMPT, temperature=float("nan")), finish_msg()), INVALID,
                 "must be finite", id="nan-temperature"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, temperature=float("inf"))), INVALID, "must be finite",
                 id="inf-temperature"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, top_p=1.5)), INVALID, "top_p must be in (0, 1]",
                 id="top-p-above-one"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, top_p=-0.1)), INVALID, "top_p must be in (0, 1]",
                 id="top-p-negative"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, top_k=-1)), INVALID, "top_k must be an int >= 0",
                 id="negative-top-k"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, max_tokens=-1)), INVALID, "max_tokens must be in [1,",
                 id="negative-max-tokens"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, speculation="-1")), INVALID,
                 "speculation depth must be in [0, 16]", id="negative-speculation-depth"),
    pytest.param(via_stream(open_msg("deep-spec", SMALL_PROMPT, speculation="17"), finish_msg()), INVALID,
                 "speculation depth must be in [0, 16]", id="speculation-depth-above-max"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, speculation="eagle")), INVALID,
                 "speculation must be off, auto or a depth", id="unknown-speculation-mode"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, kv_reuse="fuzzy")), INVALID,
                 "kv_reuse must be one of exact, blend", id="unknown-kv-reuse"),
    pytest.param(via_stream(open_msg("blend-frac", SMALL_PROMPT, kv_reuse="blend", blend_recompute=1.5), finish_msg()),
                 INVALID, "blend_recompute must be a number in [0, 1]", id="blend-recompute-above-one"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, kv_reuse="blend", blend_recompute=float("nan"))),
                 INVALID, "blend_recompute must be a number in [0, 1]", id="blend-recompute-nan"),
    pytest.param(via_stream(open_msg("absurd-max", SMALL_PROMPT, max_tokens=10**9), finish_msg()), INVALID,
                 "max_tokens must be in [1,", id="absurd-max-tokens"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, stop=[f"s{i}" for i in range(17)])), INVALID,
                 "at most 16 stop strings, got 17", id="too-many-stop-strings"),
    pytest.param(via_stream(open_msg("empty-stop", SMALL_PROMPT, stop=["ok", ""]), finish_msg()), INVALID,
                 "stop strings must be non-empty and at most 256 characters", id="empty-stop-string"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, stop=["x" * 257])), INVALID,
                 "stop strings must be non-empty and at most 256 characters", id="stop-string-too-long"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, seed=-1)), INVALID, "seed must be", id="negative-seed"),
    pytest.param(via_generate(generate_request(SMALL_PROMPT, stop_token_ids=[-3])), INVALID,
                 "stop_token_ids must be non-negative", id="negative-stop-token-id"),
    # --- ids --------------------------------------------------------------------------------
    pytest.param(via_generate(generate_request(SMALL_PROMPT, request_id="bad\x00id\n")), INVALID,
                 "request_id must be printable", id="request-id-control-chars"),
    pytest.param(via_stream(open_msg("x" * (MAX_REQUEST_ID_CHARS + 1), SMALL_PROMPT), finish_msg()), INVALID,
                 f"at most {MAX_REQUEST_ID_CHARS} characters", id="request-id-too-long"),
    # --- longer than the context -------------------------------------------------------------
    pytest.param(via_generate(generate_request([BEYOND_CONTEXT])), EXHAUSTED, TOO_LONG_TEXT,
                 id="prompt-beyond-context-generate"),
    pytest.param(via_stream(open_msg("long-open", [BEYOND_CONTEXT]), finish_msg()), EXHAUSTED, TOO_LONG_TEXT,
                 id="prompt-beyond-context-open"),
    pytest.param(via_stream(open_msg("grows", HEAD), append_msg(THIRD_OF_CONTEXT), append_msg(THIRD_OF_CONTEXT),
                            append_msg(THIRD_OF_CONTEXT), finish_msg(*SUFFIX)), EXHAUSTED,
                 f"; the limit is {CONTEXT_LIMIT}", id="prompt-grows-beyond-context-via-appends"),
    pytest.param(via_stream(open_msg("long-update", HEAD), append_msg(*DOCS), update_msg(BEYOND_CONTEXT),
                            finish_msg(*SUFFIX)), EXHAUSTED, f"; the limit is {CONTEXT_LIMIT}",
                 id="update-beyond-context"),
    pytest.param(via_stream(open_msg("long-suffix", HEAD), finish_msg(BEYOND_CONTEXT)), EXHAUSTED,
                 f"; the limit is {CONTEXT_LIMIT}", id="suffix-beyond-context"),
]


def small_generate(stub) -> Answer:
    return collect(stub.Generate(generate_request(SMALL_PROMPT, max_tokens=3), timeout=60))


def assert_healthy(service: RunningInference, baseline: Answer) -> None:
    """SERVING, no blocks held, and a small Generate still answers exactly as before."""
    service.wait_until_all_blocks_free()
    with grpc.insecure_channel(service.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE_NAME):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
    answer = small_generate(service.stub)
    assert answer.done is not None
    assert answer.tokens == baseline.tokens
    service.wait_until_all_blocks_free()


def expect_error(call: Call, stub, code: grpc.StatusCode, fragment: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        collect(call(stub))
    error = info.value
    assert error.code() == code, error.details()
    assert fragment in error.details()
    if code == EXHAUSTED and "open streams" not in fragment:
        assert error.details().startswith(TOO_LONG), error.details()
    return error


@pytest.fixture(scope="module")
def baseline(inference) -> Answer:
    answer = small_generate(inference.stub)
    assert answer.tokens and answer.done is not None
    return answer


@pytest.mark.parametrize(("call", "code", "fragment"), CASES)
def test_bad_input_is_rejected_and_harmless(inference, baseline, call, code, fragment):
    expect_error(call, inference.stub, code, fragment)
    assert_healthy(inference, baseline)


# --- streams that stay open (duplicate ids, stream limit) ------------------------------------
def gated(before, gate: threading.Event, after) -> Iterator:
    """Send `before`, wait for `gate`, then send `after` (the stream stays open meanwhile)."""
    yield from before
    assert gate.wait(timeout=60), "gate never opened"
    yield from after


class Background:
    """Run a call in a thread; `.answer` or `.error` when it ends."""

    def __init__(self, fn: Callable[[], Answer]) -> None:
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self.answer = fn()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 120) -> Answer:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "call did not end"
        if self.error is not None:
            raise self.error
        return self.answer

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


def wait_for_active(service: RunningInference, count: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while service.stats().num_active < count:
        assert time.monotonic() < deadline, f"never reached {count} active requests: {service.stats()}"
        time.sleep(0.02)


def held_stream(service: RunningInference, request_id: str, gate: threading.Event) -> Background:
    messages = gated([open_msg(request_id, HEAD, max_tokens=6), append_msg(*DOCS[:2])], gate, [finish_msg(*SUFFIX)])
    return Background(lambda: collect(service.stub.StreamPrompt(messages, timeout=120)))


def reference(stub, max_tokens: int = 6, docs=DOCS[:2]) -> Answer:
    return collect(stub.Generate(generate_request([*HEAD, *docs, *SUFFIX], max_tokens=max_tokens), timeout=120))


def test_duplicate_request_id_while_first_is_open(inference, baseline):
    gate = threading.Event()
    first = held_stream(inference, "dup", gate)
    try:
        wait_for_active(inference, 1)
        expect_error(via_generate(generate_request(SMALL_PROMPT, request_id="dup")), inference.stub,
                     grpc.StatusCode.ALREADY_EXISTS, "request 'dup' is already open")
        expect_error(via_stream(open_msg("dup", SMALL_PROMPT), finish_msg()), inference.stub,
                     grpc.StatusCode.ALREADY_EXISTS, "request 'dup' is already open")
        assert not first.done
    finally:
        gate.set()
    answer = first.join()
    assert answer.done is not None and answer.done.request_id == "dup"
    assert answer.done.finish_reason in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
    assert answer.tokens == reference(inference.stub).tokens
    # The id is free again once the first request has ended.
    again = collect(inference.stub.Generate(generate_request(SMALL_PROMPT, request_id="dup", max_tokens=3),
                                            timeout=60))
    assert again.tokens == baseline.tokens
    assert_healthy(inference, baseline)


def test_more_streams_than_max_streams(embedded_model_dir):
    service = RunningInference(embedded_model_dir, max_streams=2, token_budget=256, policy="fcfs")
    gate = threading.Event()
    held: list[Background] = []
    try:
        own_baseline = small_generate(service.stub)
        held = [held_stream(service, f"held-{i}", gate) for i in range(2)]
        wait_for_active(service, 2)
        expect_error(via_generate(generate_request(SMALL_PROMPT)), service.stub, EXHAUSTED,
                     "too many open streams (limit 2)")
        expect_error(via_stream(open_msg("third", SMALL_PROMPT), finish_msg()), service.stub, EXHAUSTED,
                     "too many open streams (limit 2)")
        assert not any(h.done for h in held)
        gate.set()
        answers = [h.join() for h in held]
        expected = reference(service.stub).tokens   # the slots are free again once the held streams ended
        for answer in answers:
            assert answer.done is not None and answer.tokens == expected
        assert_healthy(service, own_baseline)
    finally:
        gate.set()
        for h in held:
            h._thread.join(60)
        service.stop()


def test_max_streams_holds_for_streams_that_open_late(embedded_model_dir):
    service = RunningInference(embedded_model_dir, max_streams=2, token_budget=256, policy="fcfs")
    gate, finish_gate = threading.Event(), threading.Event()
    calls: list[Background] = []
    try:
        for i in range(3):
            messages = gated([], gate, gated([open_msg(f"late-{i}", HEAD, max_tokens=3)], finish_gate,
                                             [finish_msg(*SUFFIX)]))
            calls.append(Background(lambda m=messages: collect(service.stub.StreamPrompt(m, timeout=120))))
        time.sleep(1.0)              # every call has reached the server and waits for its first message
        gate.set()
        time.sleep(1.0)
        peak_active = service.stats().num_active
        finish_gate.set()
        outcomes = []
        for c in calls:
            try:
                c.join()
                outcomes.append("ok")
            except grpc.RpcError as exc:
                outcomes.append(exc.code())
        service.wait_until_all_blocks_free()
        assert peak_active <= 2, f"{peak_active} requests active with max_streams=2"
        assert sorted(map(str, outcomes)) == sorted(map(str, ["ok", "ok", EXHAUSTED]))
    finally:
        gate.set()
        finish_gate.set()
        for c in calls:
            c._thread.join(60)
        service.stop()


def test_empty_suffix_after_complete_prefill_still_answers(inference, baseline):
    gate = threading.Event()
    computed = inference.stats().counters.prompt_tokens_computed
    messages = gated([open_msg("empty-suffix", SMALL_PROMPT, max_tokens=3)], gate, [finish_msg()])
    call = Background(lambda: collect(inference.stub.StreamPrompt(messages, timeout=10)))
    try:
        deadline = time.monotonic() + 30
        while inference.stats().counters.prompt_tokens_computed < computed + baseline.done.stats.prompt_tokens:
            assert time.monotonic() < deadline, "the prompt was never prefilled"
            time.sleep(0.02)
    finally:
        gate.set()
    try:
        answer = call.join()
        assert answer.tokens == baseline.tokens
    finally:
        assert_healthy(inference, baseline)


# --- hostile traffic next to a valid stream ---------------------------------------------------
def test_valid_stream_undisturbed_by_concurrent_hostile_calls(inference, baseline):
    expected = reference(inference.stub, max_tokens=16, docs=DOCS)
    messages = [open_msg("valid-neighbour", HEAD, max_tokens=16), *(append_msg(d) for d in DOCS),
                finish_msg(*SUFFIX)]
    valid = Background(lambda: collect(inference.stub.StreamPrompt(paced(messages, 0.2), timeout=120)))
    hostile = [(p.values[0], p.values[1], p.values[2]) for p in CASES]
    rounds = 0
    while not valid.done or rounds == 0:
        for call, code, fragment in hostile:
            expect_error(call, inference.stub, code, fragment)
        rounds += 1
    answer = valid.join()
    assert answer.done is not None and answer.done.request_id == "valid-neighbour"
    assert answer.tokens == expected.tokens
    assert answer.text == expected.text
    assert answer.done.stats.tokens_invalidated == 0
    assert_healthy(inference, baseline)


# --- advisory hints, too-long prompts, undecodable bytes ---------------------------------------
def in_process(service: RunningInference) -> bool:
    """The native harness runs the server in this process, so its log records reach caplog."""
    return hasattr(service, "service")


def test_unknown_policy_hint_is_accepted_and_logged(inference, baseline, caplog):
    caplog.set_level(logging.WARNING)
    answer = collect(inference.stub.Generate(generate_request(SMALL_PROMPT, max_tokens=3, policy_hint="yolo"),
                                             timeout=60))
    assert answer.tokens == baseline.tokens
    answer = collect(inference.stub.StreamPrompt(iter([open_with_hint("odd-hint", SMALL_PROMPT, "LCAS "),
                                                       finish_msg()]), timeout=60))
    assert answer.done is not None and answer.done.request_id == "odd-hint"
    if in_process(inference):
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("ignoring unknown policy hint 'yolo'" in m for m in warnings), warnings
        assert any("ignoring unknown policy hint 'LCAS '" in m for m in warnings), warnings
    assert_healthy(inference, baseline)


def test_a_prompt_too_long_is_answered_the_same_whichever_limit_it_hits(inference, baseline):
    too_many_ids = common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=[42] * (MAX_SEGMENT_CHARS + 1)))
    calls = {
        "segment characters": via_generate(generate_request([HUGE_TEXT])),
        "segment token ids": via_stream(open_msg("many-ids", HEAD), append_msg(too_many_ids), finish_msg(*SUFFIX)),
        "segments per message": via_stream(open_msg("many-segs", TOO_MANY_SEGMENTS), finish_msg()),
        "tokens beyond the context": via_stream(open_msg("many-tokens", HEAD), update_msg(BEYOND_CONTEXT),
                                                finish_msg(*SUFFIX)),
    }
    for limit, call in calls.items():
        error = expect_error(call, inference.stub, EXHAUSTED, TOO_LONG)
        assert "; the limit is " in error.details(), (limit, error.details())
    assert_healthy(inference, baseline)


def undecodable(message, placeholder: str = "PLACEHOLDER") -> bytes:
    """`message` serialized, with `placeholder` (in a string field) replaced by as many bytes
    that are not UTF-8, so every length prefix stays right."""
    data = message.SerializeToString()
    bad = b"abc \xff\xfe defg"
    assert len(bad) == len(placeholder.encode()) and data.count(placeholder.encode()) == 1
    return data.replace(placeholder.encode(), bad)


CORRUPT = b"\x0a\x05ab"   # field 1, 5 bytes long, but only 2 follow
BAD_UTF8_GENERATE = undecodable(generate_request([seg("PLACEHOLDER")], request_id="bad-utf8"))
BAD_UTF8_OPEN = undecodable(open_msg("bad-utf8-open", [seg("PLACEHOLDER")]))
BAD_UTF8_APPEND = undecodable(append_msg(seg("PLACEHOLDER", "doc")))

# (method, how it is called, the request bytes, fragment of the status message)
UNDECODABLE = [
    pytest.param("Generate", "unary_stream", CORRUPT, "undecodable request message", id="generate-corrupt"),
    pytest.param("Generate", "unary_stream", BAD_UTF8_GENERATE, "UTF-8", id="generate-bad-utf8-text"),
    pytest.param("Describe", "unary_unary", CORRUPT, "undecodable request message", id="describe-corrupt"),
    pytest.param("GetStats", "unary_unary", CORRUPT, "undecodable request message", id="get-stats-corrupt"),
    pytest.param("StreamPrompt", "stream_stream", [CORRUPT], "undecodable request message", id="stream-corrupt-first"),
    pytest.param("StreamPrompt", "stream_stream", [BAD_UTF8_OPEN, finish_msg().SerializeToString()], "UTF-8",
                 id="stream-bad-utf8-open"),
    pytest.param("StreamPrompt", "stream_stream",
                 [open_msg("bad-utf8-later", HEAD).SerializeToString(), BAD_UTF8_APPEND,
                  finish_msg(*SUFFIX).SerializeToString()], "UTF-8", id="stream-bad-utf8-append"),
]


@pytest.mark.parametrize(("method", "arity", "payload", "fragment"), UNDECODABLE)
def test_undecodable_request_bytes_get_invalid_argument(inference, baseline, caplog, method, arity, payload,
                                                        fragment):
    caplog.set_level(logging.WARNING)
    with grpc.insecure_channel(inference.address) as channel:
        call = getattr(channel, arity)(f"/{SERVICE_NAME}/{method}")   # no serializers: raw bytes go out
        with pytest.raises(grpc.RpcError) as info:
            if arity == "stream_stream":
                list(call(iter(payload), timeout=60))
            elif arity == "unary_stream":
                list(call(payload, timeout=60))
            else:
                call(payload, timeout=60)
    error = info.value
    assert error.code() == INVALID, error.details()
    assert "undecodable request message" in error.details() and fragment in error.details()
    if in_process(inference):
        records = [r for r in caplog.records if "undecodable request message" in r.getMessage()]
        assert records and all(r.levelno == logging.WARNING for r in records)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "logged as a servicer exception"
    assert_healthy(inference, baseline)
