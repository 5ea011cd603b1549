"""Disaggregated prefill and decode through real gRPC with the real model (fp32): a prefill replica
ships a streamed prompt's KV chunk by chunk to a decode replica, which decodes; the answer equals
Generate token for token, after updates too; a decode replica that dies makes the prefill replica
decode itself with the same answer; bad transfers get their status; no block leaks on either side."""

from __future__ import annotations

import re
import time

import grpc
import pytest
import torch

from inference_svc.engine.kv_export import export_blocks, layout_of, to_bytes
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.wire import DECODE_TARGET_KEY, layout_to_proto
from protos import common_pb2, inference_pb2, kv_transfer_pb2, kv_transfer_pb2_grpc
from tests.support.inference import RunningInference
from tests.support.inference_calls import (
    DOCS,
    HEAD,
    OTHER,
    SUFFIX,
    append_msg,
    collect,
    finish_msg,
    open_msg,
    paced,
    update_msg,
)

KIND = "LIFECYCLE_EVENT_KIND_"


def _replica(model_dir, role: str):
    service = RunningInference(model_dir, role=role, token_budget=256, max_streams=16, kv_device_blocks=256,
                               kv_cpu_blocks=64)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def prefill(embedded_model_dir):
    yield from _replica(embedded_model_dir, "prefill")


@pytest.fixture(scope="module")
def decode(embedded_model_dir):
    yield from _replica(embedded_model_dir, "decode")


def generate(stub, segments, request_id, max_tokens=24):
    request = inference_pb2.GenerateRequest(request_id=request_id, segments=segments,
                                            sampling=common_pb2.SamplingParams(max_tokens=max_tokens))
    return collect(stub.Generate(request, timeout=120))


def through_pair(prefill, decode_address, messages, gap_s=0.15, timeout=120):
    return collect(prefill.stub.StreamPrompt(paced(messages, gap_s), timeout=timeout,
                                             metadata=((DECODE_TARGET_KEY, decode_address),)))


def kinds(answer) -> list[str]:
    return [k.removeprefix(KIND) for k in answer.lifecycle]


def check_pool(service):
    """Every block free and the accounting invariant holding (on the engine thread)."""
    service.wait_until_all_blocks_free()

    def check(engine):
        engine.scheduler.kv.check_invariants()
        return engine.scheduler.pools()[0].num_free, engine.scheduler.pools()[0].num_blocks

    free, total = service.run(service.service.thread.call(check), 30)
    assert free == total


def test_pair_answers_like_generate_with_the_transfer_in_the_lifecycle(prefill, decode):
    want = generate(prefill.stub, HEAD + DOCS + SUFFIX, "reference")
    messages = [open_msg("pair", HEAD, max_tokens=24), *(append_msg(d) for d in DOCS), finish_msg(*SUFFIX)]
    calls_before = decode.service.kv_transfer.calls
    answer = through_pair(prefill, decode.address, messages)
    assert answer.tokens == want.tokens and answer.text == want.text
    assert answer.done.text == want.done.text
    assert decode.service.kv_transfer.calls == calls_before + 1       # decoded over there
    events = kinds(answer)
    assert events.index("KV_TRANSFER_START") < events.index("KV_TRANSFER_CHUNK") < events.index("KV_HANDOFF")
    assert events.index("KV_HANDOFF") < events.index("FIRST_TOKEN")
    assert "KV_TRANSFER_FALLBACK" not in events
    assert events.count("KV_TRANSFER_CHUNK") >= 2      # shipped while the prompt was still streaming
    assert answer.done.stats.prompt_tokens == want.done.stats.prompt_tokens
    assert answer.done.stats.generated_tokens == len(want.tokens)
    check_pool(prefill)
    check_pool(decode)


def test_update_invalidates_on_both_sides_and_answers_like_generate(prefill, decode):
    want = generate(prefill.stub, [*HEAD, DOCS[0], OTHER, *SUFFIX], "reference-update")
    invalidated_before = decode.stats().counters.tokens_invalidated

    def messages():
        yield open_msg("pair-update", HEAD, max_tokens=24)
        for doc in DOCS:
            yield append_msg(doc)
        _wait_shipped(prefill, decode, "pair-update")      # both sides hold KV the update invalidates
        yield update_msg(DOCS[0], OTHER)
        yield finish_msg(*SUFFIX)

    answer = through_pair(prefill, decode.address, messages(), gap_s=0)
    assert answer.tokens == want.tokens
    assert "INVALIDATED" in kinds(answer)                                       # the prefill side
    assert decode.stats().counters.tokens_invalidated > invalidated_before     # the decode side
    check_pool(prefill)
    check_pool(decode)


def _call(service, fn):
    return service.run(service.service.thread.call(fn), 60)


def test_a_partly_filled_last_block_is_sent_and_completed_by_the_next_chunk(prefill, decode):
    """Export 21 tokens (a full block and 5 of the next), then 40 (the partial block again, filled
    further): the decode side's KV equals the prefill side's, byte for byte, for every token."""
    tokens = list(range(100, 140))
    bs = _call(prefill, lambda e: e.scheduler.block_size)
    assert 21 % bs and 40 % bs

    def open_prefill(engine):
        engine.open("partial", [Segment(token_ids=tuple(tokens[:21]))], SamplingParams(max_tokens=1))

    _call(prefill, open_prefill)
    _wait_computed(prefill, "partial", 21)
    first = _call(prefill, lambda e: export_blocks(e, e.requests["partial"], 0, 21))
    _call(prefill, lambda e: e.append("partial", [Segment(token_ids=tuple(tokens[21:]))]))
    _wait_computed(prefill, "partial", 40)
    second = _call(prefill, lambda e: export_blocks(e, e.requests["partial"], 16, 40))
    whole = _call(prefill, lambda e: export_blocks(e, e.requests["partial"], 0, 40))
    _call(prefill, lambda e: e.abort("partial"))

    layout = _call(decode, layout_of)
    stub = kv_transfer_pb2_grpc.KvTransferStub(decode.channel)

    def blocks(start, ids, data):
        return kv_transfer_pb2.TransferRequest(request_id="partial", blocks=kv_transfer_pb2.KvBlocks(
            start_token=start, token_ids=ids, num_blocks=data.shape[2], data=to_bytes(data)))

    held = {}

    def requests():
        yield kv_transfer_pb2.TransferRequest(request_id="partial", begin=kv_transfer_pb2.KvBegin(
            sampling=common_pb2.SamplingParams(max_tokens=1), layout=layout_to_proto(layout)))
        yield blocks(0, tokens[:21], first)
        yield blocks(16, tokens[16:40], second)
        while "kv" not in held:
            time.sleep(0.02)

    call = stub.Transfer(requests(), timeout=60)
    acks = []
    for response in call:
        if response.WhichOneof("kind") != "ack":
            continue
        acks.append((response.ack.tokens, response.ack.imported_tokens))
        if len(acks) == 2:
            def read(engine):
                request = engine.requests["partial"]
                return request.num_computed_tokens, export_blocks(engine, request, 0, 40)
            held["kv"] = _call(decode, read)
            call.cancel()
            break
    assert acks == [(21, 21), (40, 24)]
    computed, kv = held["kv"]
    assert computed == 40
    flat = lambda t: t.flatten(2, 3)[:, :, :40]  # noqa: E731 - [layers, 2, tokens, heads, dim]
    assert torch.equal(flat(kv), flat(whole))
    assert torch.equal(flat(first)[:, :, :21], flat(whole)[:, :, :21])
    check_pool(prefill)
    check_pool(decode)


def _wait_shipped(prefill, decode, request_id, timeout_s=60):
    """Until the decode side holds the KV of every prompt token the prefill side has."""
    def prompt(engine):
        request = engine.requests.get(f"{request_id}@prefill")
        return None if request is None else len(request.prompt_token_ids)

    def held(engine):
        request = engine.requests.get(request_id)
        return None if request is None else request.num_computed_tokens

    deadline = time.monotonic() + timeout_s
    while (want := _call(prefill, prompt)) is None or _call(decode, held) != want:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _wait_computed(service, request_id, n, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while _call(service, lambda e: e.requests[request_id].num_computed_tokens) < n:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _transfer_status(decode, messages) -> grpc.StatusCode:
    stub = kv_transfer_pb2_grpc.KvTransferStub(decode.channel)
    with pytest.raises(grpc.RpcError) as failure:
        list(stub.Transfer(iter(messages), timeout=30))
    return failure.value.code(), failure.value.details()


def test_bad_transfers_get_their_status(decode):
    layout = layout_to_proto(_call(decode, layout_of))
    begin = kv_transfer_pb2.TransferRequest(request_id="bad", begin=kv_transfer_pb2.KvBegin(layout=layout))
    unknown = kv_transfer_pb2.TransferRequest(request_id="nobody", blocks=kv_transfer_pb2.KvBlocks(
        start_token=0, token_ids=[1], num_blocks=1))
    code, details = _transfer_status(decode, [unknown])
    assert code is grpc.StatusCode.NOT_FOUND and "nobody" in details
    too_many = kv_transfer_pb2.TransferRequest(request_id="bad", blocks=kv_transfer_pb2.KvBlocks(
        start_token=0, token_ids=[1] * 16, num_blocks=10_000))
    code, details = _transfer_status(decode, [begin, too_many])
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "device pool" in details
    other = kv_transfer_pb2.TransferRequest(request_id="other", blocks=kv_transfer_pb2.KvBlocks(
        start_token=0, token_ids=[1], num_blocks=1))
    code, _ = _transfer_status(decode, [begin, other])
    assert code is grpc.StatusCode.NOT_FOUND
    short = kv_transfer_pb2.TransferRequest(request_id="bad", blocks=kv_transfer_pb2.KvBlocks(
        start_token=0, token_ids=[1], num_blocks=1, data=b"123"))
    code, details = _transfer_status(decode, [begin, short])
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "bytes" in details
    wrong = kv_transfer_pb2.KvLayout()
    wrong.CopyFrom(layout)
    wrong.head_dim += 1
    code, _ = _transfer_status(decode, [kv_transfer_pb2.TransferRequest(
        request_id="bad", begin=kv_transfer_pb2.KvBegin(layout=wrong))])
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    check_pool(decode)


def test_decode_replica_killed_mid_stream_falls_back_with_the_same_answer(prefill, embedded_model_dir):
    doomed = RunningInference(embedded_model_dir, role="both", token_budget=256, max_streams=16,
                              kv_device_blocks=256, kv_cpu_blocks=64)
    try:
        want = generate(prefill.stub, HEAD + DOCS + SUFFIX, "reference-fallback")

        def messages():
            yield open_msg("pair-fallback", HEAD, max_tokens=24)
            yield append_msg(DOCS[0])
            deadline = time.monotonic() + 60
            while doomed.service.kv_transfer.calls == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)                                    # the first chunk has been shipped
            doomed.run(doomed.service.runner.stop(0), 30)
            for doc in DOCS[1:]:
                yield append_msg(doc)
            yield finish_msg(*SUFFIX)

        answer = through_pair(prefill, doomed.address, messages(), gap_s=0)
        assert answer.tokens == want.tokens
        events = kinds(answer)
        assert "KV_TRANSFER_START" in events and "KV_TRANSFER_FALLBACK" in events
        assert "KV_HANDOFF" not in events
        check_pool(prefill)

        def leftover(engine):      # the dead replica's engine still runs: it freed the request
            engine.scheduler.kv.check_invariants()
            return [r.request_id for r in engine.requests.values()], engine.scheduler.pools()[0].num_free

        deadline = time.monotonic() + 30
        while True:
            ids, free = _call(doomed, leftover)
            if not ids and free == 256:
                break
            assert time.monotonic() < deadline, (ids, free)
            time.sleep(0.05)
    finally:
        doomed.stop()


def test_decode_replica_killed_after_the_hand_off_falls_back_with_the_same_answer(prefill, embedded_model_dir):
    doomed = RunningInference(embedded_model_dir, role="both", token_budget=256, max_streams=16,
                              kv_device_blocks=256, kv_cpu_blocks=64)
    try:
        want = generate(prefill.stub, HEAD + DOCS + SUFFIX, "reference-late", max_tokens=32)
        messages = [open_msg("pair-late", HEAD, max_tokens=32), *(append_msg(d) for d in DOCS), finish_msg(*SUFFIX)]
        answer = collect_until_tokens(prefill, doomed, messages, kill_after=4)
        assert answer.tokens == want.tokens
        events = kinds(answer)
        assert "KV_HANDOFF" in events and "KV_TRANSFER_FALLBACK" in events
        check_pool(prefill)
    finally:
        doomed.stop()


def collect_until_tokens(prefill, doomed, messages, kill_after):
    """Collect the pair's answer, stopping the decode replica's server after `kill_after` tokens."""
    responses = prefill.stub.StreamPrompt(paced(messages, 0.1), timeout=120,
                                          metadata=((DECODE_TARGET_KEY, doomed.address),))
    seen = 0

    def watched():
        nonlocal seen
        for response in responses:
            if response.event.WhichOneof("kind") == "token":
                seen += 1
                if seen == kill_after:
                    doomed.run(doomed.service.runner.stop(0), 30)
            yield response

    return collect(watched())


def test_the_hand_off_detail_names_its_time(prefill, decode):
    messages = [open_msg("pair-detail", HEAD, max_tokens=4), *(append_msg(d) for d in DOCS), finish_msg(*SUFFIX)]
    responses = list(prefill.stub.StreamPrompt(paced(messages, 0.1), timeout=120,
                                               metadata=((DECODE_TARGET_KEY, decode.address),)))
    details = [r.event.lifecycle.detail for r in responses if r.event.WhichOneof("kind") == "lifecycle"
               and r.event.lifecycle.kind == common_pb2.LIFECYCLE_EVENT_KIND_KV_HANDOFF]
    assert len(details) == 1 and re.search(r"transfer [0-9.]+ ms after the last chunk's KV; "
                                                 r"hand-off [0-9.]+ ms after the last input", details[0])
    chunks = [r.event.lifecycle for r in responses if r.event.WhichOneof("kind") == "lifecycle"
              and r.event.lifecycle.kind == common_pb2.LIFECYCLE_EVENT_KIND_KV_TRANSFER_CHUNK]
    assert chunks and all(c.count > 0 and " ms" in c.detail for c in chunks)
