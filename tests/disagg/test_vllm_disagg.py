"""Disaggregated prefill and decode on the vLLM backend: two vLLM services (`--role prefill`,
`--role decode`, fp32) hand a streamed prompt's KV over `KvTransfer` through our KV connector, and
greedy output through the pair equals Generate token for token, after an update too; the decode
replica computes only the prompt's tail itself; neither side keeps a block afterwards; a bad
transfer gets its status; a decode replica that is unreachable, fails after `finish` before a
token, or stops after relaying tokens makes the prefill replica decode (the rest) itself, with the
same answer; the orchestrator pairs the two replicas by the roles they report, as it pairs native
ones.

    /opt/vllm-venv/bin/python -m pytest --run-vllm -m vllm tests/disagg/test_vllm_disagg.py
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from inference_svc.kv_transfer.wire import DECODE_TARGET_KEY
from protos import (
    common_pb2,
    inference_pb2,
    kv_transfer_pb2,
    kv_transfer_pb2_grpc,
    orchestrator_pb2,
)
from tests.support.inference import InferenceProcess
from tests.support.inference_calls import (
    HEAD,
    SUFFIX,
    append_msg,
    collect,
    finish_msg,
    open_msg,
    paced,
    seg,
    update_msg,
)
from tests.support.orchestrator import RunningOrchestrator
from tests.support.redis_server import PrivateRedis

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

DOCS = [          # longer than tests/support/inference_calls.DOCS
    seg("[files] Use open() to read a file; the with statement closes it for you when the block ends.\n", "files"),
    seg("[lists] A list is a mutable sequence; append() adds an item at the end, pop() removes one.\n", "lists"),
    seg("[io] read() returns the whole content, readline() returns one line and readlines() all of them.\n", "io"),
]
OTHER = seg("[dicts] A dict maps keys to values; get() returns a default when the key is missing.\n", "dicts")
KIND = "LIFECYCLE_EVENT_KIND_"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def prefill(embedded_model_dir):
    service = InferenceProcess(embedded_model_dir, backend="vllm", max_streams=8, extra_args=("--role", "prefill"))
    yield service
    service.stop()


@pytest.fixture(scope="module")
def decode(embedded_model_dir):
    service = InferenceProcess(embedded_model_dir, backend="vllm", max_streams=8, extra_args=("--role", "decode"))
    yield service
    service.stop()


def generate(service, segments, request_id, max_tokens=MAX_TOKENS):
    """The reference, on the prefill replica (the decode replica's prefix cache stays empty, so what it
    does not compute must have come over the transfer)."""
    return collect(service.stub.Generate(inference_pb2.GenerateRequest(
        request_id=request_id, segments=segments, sampling=common_pb2.SamplingParams(max_tokens=max_tokens)),
        timeout=180))


def kinds(answer) -> list[str]:
    return [k.removeprefix(KIND) for k in answer.lifecycle]


def through_pair(prefill, decode_address, messages, timeout=180):
    metadata = ((DECODE_TARGET_KEY, decode_address),)
    return collect(prefill.stub.StreamPrompt(messages, timeout=timeout, metadata=metadata))


def test_roles_are_reported(prefill, decode):
    assert (prefill.stats().role, decode.stats().role) == ("prefill", "decode")


def test_pair_answers_like_generate_and_the_decode_side_computes_only_the_tail(prefill, decode):
    segments = [*HEAD, *DOCS, OTHER, *SUFFIX]
    want = generate(prefill, segments, "reference")
    computed_before = decode.stats().counters.prompt_tokens_computed
    messages = [open_msg("pair", HEAD, max_tokens=MAX_TOKENS), *(append_msg(d) for d in [*DOCS, OTHER]),
                finish_msg(*SUFFIX)]
    answer = through_pair(prefill, decode.address, paced(messages, 0.3))
    assert answer.tokens == want.tokens and answer.text == want.text
    assert answer.done.text == want.done.text
    events = kinds(answer)
    assert "KV_TRANSFER_FALLBACK" not in events
    assert events.index("KV_TRANSFER_START") < events.index("KV_TRANSFER_CHUNK") < events.index("KV_HANDOFF")
    assert events.index("KV_HANDOFF") < events.index("FIRST_TOKEN")
    assert events.count("KV_TRANSFER_CHUNK") >= 2        # shipped while the prompt was still streaming
    prompt_tokens = answer.done.stats.prompt_tokens
    assert prompt_tokens == want.done.stats.prompt_tokens
    # The decode replica loaded the shipped KV: it computed the last prompt token, not the prompt.
    stats = decode.wait_until_all_blocks_free()
    assert 0 < stats.counters.prompt_tokens_computed - computed_before < prompt_tokens // 2
    prefill.wait_until_all_blocks_free()


def test_update_after_shipping_answers_like_generate(prefill, decode):
    want = generate(prefill, [*HEAD, DOCS[0], OTHER, *SUFFIX], "reference-update")
    shipped = threading.Event()

    def messages():
        yield open_msg("pair-update", HEAD, max_tokens=MAX_TOKENS)
        for doc in DOCS:
            yield append_msg(doc)
        assert shipped.wait(120), "no KV was shipped before the update"
        yield update_msg(DOCS[0], OTHER)          # invalidates KV both sides hold
        yield finish_msg(*SUFFIX)

    def watch(responses):
        chunks = 0
        for response in responses:
            event = response.event
            if event.WhichOneof("kind") == "lifecycle" and event.lifecycle.kind == \
                    common_pb2.LIFECYCLE_EVENT_KIND_KV_TRANSFER_CHUNK:
                chunks += 1
                if chunks >= 2:
                    shipped.set()
            yield response

    call = prefill.stub.StreamPrompt(messages(), timeout=180, metadata=((DECODE_TARGET_KEY, decode.address),))
    answer = collect(watch(call))
    assert answer.tokens == want.tokens and answer.text == want.text
    events = kinds(answer)
    assert "INVALIDATED" in events and "KV_HANDOFF" in events and "KV_TRANSFER_FALLBACK" not in events
    decode.wait_until_all_blocks_free()
    prefill.wait_until_all_blocks_free()


def test_bad_transfers_get_their_status(decode):
    stub = kv_transfer_pb2_grpc.KvTransferStub(decode.channel)
    unknown = kv_transfer_pb2.TransferRequest(request_id="nobody", finish=kv_transfer_pb2.KvFinish())
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Transfer(iter([unknown]), timeout=30))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    wrong = kv_transfer_pb2.TransferRequest(request_id="odd-layout", begin=kv_transfer_pb2.KvBegin(
        layout=kv_transfer_pb2.KvLayout(num_layers=1, num_kv_heads=1, head_dim=8, block_size=32, dtype="float32")))
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Transfer(iter([wrong]), timeout=30))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    decode.wait_until_all_blocks_free()


def test_unreachable_decode_replica_falls_back_to_decoding_here(prefill):
    want = generate(prefill, HEAD + DOCS + SUFFIX, "reference-fallback")
    messages = [open_msg("pair-fallback", HEAD, max_tokens=MAX_TOKENS), *(append_msg(d) for d in DOCS),
                finish_msg(*SUFFIX)]
    answer = through_pair(prefill, "127.0.0.1:1", paced(messages, 0.1))
    assert answer.tokens == want.tokens
    assert "KV_TRANSFER_FALLBACK" in kinds(answer)
    prefill.wait_until_all_blocks_free()


def test_decode_replica_stopped_after_relaying_tokens_resumes_here_with_the_same_answer(prefill,
                                                                                      embedded_model_dir):
    """The decode replica stops (no grace: the transfer call is cancelled) once the caller has 4 of its
    tokens: the prefill replica submits the prompt and those tokens and decodes the rest itself."""
    max_tokens, stop_after = 48, 4
    want = generate(prefill, HEAD + DOCS + SUFFIX, "reference-resume", max_tokens=max_tokens)
    assert len(want.tokens) > stop_after + 8, "the reference answer is too short to stop the decode replica in it"
    doomed = InferenceProcess(embedded_model_dir, backend="vllm", max_streams=8,
                              extra_args=("--role", "decode", "--grace", "0"))
    try:
        messages = [open_msg("pair-resume", HEAD, max_tokens=max_tokens), *(append_msg(d) for d in DOCS),
                    finish_msg(*SUFFIX)]
        responses = prefill.stub.StreamPrompt(paced(messages, 0.1), timeout=180,
                                              metadata=((DECODE_TARGET_KEY, doomed.address),))

        def watched():
            seen = 0
            for response in responses:
                if response.event.WhichOneof("kind") == "token":
                    seen += 1
                    if seen == stop_after:
                        doomed.handle.stop()
                yield response

        answer = collect(watched())
    finally:
        doomed.stop()
    assert answer.tokens == want.tokens and answer.text == want.text
    assert answer.done.text == want.done.text and answer.done.finish_reason == want.done.finish_reason
    assert answer.done.stats.generated_tokens == len(want.tokens)
    assert answer.done.stats.prompt_tokens == want.done.stats.prompt_tokens
    events = kinds(answer)
    assert events.index("KV_HANDOFF") < events.index("FIRST_TOKEN") < events.index("KV_TRANSFER_FALLBACK")
    assert events.count("FIRST_TOKEN") == 1 and events.count("FINISHED") == 1
    prefill.wait_until_all_blocks_free()


def test_decode_replica_failing_after_finish_before_a_token_falls_back_with_the_same_answer(prefill,
                                                                                         embedded_model_dir):
    """A decode replica whose context is shorter than the prompt holds every block, acks `finish`
    (KV_HANDOFF), then refuses the prompt: the prefill replica submits the whole prompt again here."""
    want = generate(prefill, HEAD + DOCS + SUFFIX, "reference-refused")
    assert want.done.stats.prompt_tokens > 64
    short = InferenceProcess(embedded_model_dir, backend="vllm", max_streams=8,
                                 extra_args=("--role", "decode", "--max-model-len", "64"))
    try:
        messages = [open_msg("pair-refused", HEAD, max_tokens=MAX_TOKENS), *(append_msg(d) for d in DOCS),
                    finish_msg(*SUFFIX)]
        answer = through_pair(prefill, short.address, paced(messages, 0.1))
        short.wait_until_all_blocks_free()
    finally:
        short.stop()
    assert answer.tokens == want.tokens and answer.done.text == want.done.text
    events = kinds(answer)
    assert events.index("KV_HANDOFF") < events.index("KV_TRANSFER_FALLBACK") < events.index("FIRST_TOKEN")
    prefill.wait_until_all_blocks_free()


def test_the_orchestrator_pairs_vllm_replicas_by_role(prefill, decode, tmp_path):
    redis = PrivateRedis(tmp_path)
    orchestrator = None
    try:
        orchestrator = RunningOrchestrator(redis.url, [decode.address, prefill.address], router_refresh_s=0.2)
        stub, service = orchestrator.stub, orchestrator.service
        deadline = time.monotonic() + 60
        while not all(r.stats is not None and r.stats.role for r in service.router.replicas):
            assert time.monotonic() < deadline, "the router never saw the roles"
            time.sleep(0.1)
        baseline = _ask(stub, "colocated", no_stream=True)          # Generate: always colocated
        done = _ask(stub, "paired")
        assert done.replica == prefill.address and done.answer == baseline.answer
        record = stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id="paired"), timeout=30).record
        events = [event.kind for event in record.events]
        assert "KV_HANDOFF" in events and "KV_TRANSFER_FALLBACK" not in events
        assert events.index("KV_HANDOFF") < events.index("FIRST_TOKEN")
    finally:
        if orchestrator is not None:
            orchestrator.stop()
        redis.stop()
    prefill.wait_until_all_blocks_free()
    decode.wait_until_all_blocks_free()


def _ask(stub, request_id, no_stream=False):
    request = orchestrator_pb2.AskRequest(question="What is the capital of France?",
                                          retriever=orchestrator_pb2.RETRIEVER_CHOICE_NONE, max_tokens=16,
                                          request_id=request_id, no_stream=no_stream)
    return next(r.event.done for r in stub.Ask(request, timeout=180) if r.event.WhichOneof("kind") == "done")
