"""Black-box tests of the Inference service through real gRPC with the real model (fp32):
streamed prompts answer exactly like Generate, under preemption too, cancellation frees
every block, many concurrent streams finish correctly, `done` counts the appends and updates,
and stop strings cut the answer."""

from __future__ import annotations

import threading

import grpc
import pytest

from protos import common_pb2, inference_pb2
from tests.support.inference import RunningInference
from tests.support.inference_calls import (
    DOCS,
    HEAD,
    OTHER,
    SUFFIX,
    append_msg,
    collect,
    finish_msg,
    held_until_all_prefilled,
    open_msg,
    paced,
    seg,
    update_msg,
)

PARIS = [seg("<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
             "<|im_start|>assistant\n")]


def generate(stub, segments, request_id, max_tokens=8, **sampling):
    request = inference_pb2.GenerateRequest(request_id=request_id, segments=segments,
                                            sampling=common_pb2.SamplingParams(max_tokens=max_tokens, **sampling))
    return collect(stub.Generate(request, timeout=120))


@pytest.fixture(scope="module")
def reference(inference):
    return generate(inference.stub, HEAD + DOCS + SUFFIX, "reference")


def test_generate_answers_with_stats(reference):
    assert reference.tokens and reference.done is not None
    assert reference.done.stats.prompt_tokens > 40
    assert reference.lifecycle[:2] == ["LIFECYCLE_EVENT_KIND_QUEUED", "LIFECYCLE_EVENT_KIND_SCHEDULED"]
    assert reference.lifecycle[-1] == "LIFECYCLE_EVENT_KIND_FINISHED"
    assert reference.text == reference.done.text
    assert (reference.done.stats.num_appends, reference.done.stats.num_updates) == (0, 0)


def test_streamed_appends_answer_like_generate(inference, reference):
    messages = [open_msg("appends", HEAD), *(append_msg(d) for d in DOCS), finish_msg(*SUFFIX)]
    answer = collect(inference.stub.StreamPrompt(paced(messages, 0.05), timeout=120))
    assert answer.tokens == reference.tokens
    stats = answer.done.stats
    assert stats.ttft_from_open_s >= stats.ttft_from_last_chunk_s > 0
    assert stats.tokens_invalidated == 0
    assert (stats.num_appends, stats.num_updates) == (len(DOCS), 0)
    inference.wait_until_all_blocks_free()


def test_seeded_sampling_streamed_answers_like_generate(inference):
    """Temperature > 0 with a seed: a streamed prompt samples the same tokens as Generate. On vLLM
    this holds only if the final turn gets a generator seeded as a plain submission's would."""
    sampling = {"temperature": 1.0, "top_p": 0.95, "seed": 1234, "ignore_eos": True}
    want = generate(inference.stub, HEAD + DOCS + SUFFIX, "seeded-reference", max_tokens=16, **sampling)
    messages = [open_msg("seeded", HEAD, max_tokens=16, **sampling), *(append_msg(d) for d in DOCS),
                finish_msg(*SUFFIX)]
    answer = collect(inference.stub.StreamPrompt(paced(messages, 0.05), timeout=120))
    assert len(want.tokens) == 16
    assert answer.tokens == want.tokens
    inference.wait_until_all_blocks_free()


def hinted(segment: common_pb2.Segment, stability: float) -> common_pb2.Segment:
    out = common_pb2.Segment()
    out.CopyFrom(segment)
    out.stability = stability
    return out


def test_stability_hinted_refinements_answer_like_generate(inference, reference):
    """Non-final refinements with stability hints (a newcomer deferred), then the final stage."""
    refine = inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(update=inference_pb2.PromptReplace(
        segments=[hinted(DOCS[0], 0.3), hinted(OTHER, 0.3)], final_stage=False)))
    refine2 = inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(update=inference_pb2.PromptReplace(
        segments=[hinted(DOCS[0], 0.9), hinted(DOCS[1], 0.3), hinted(DOCS[2], 0.3)], final_stage=False)))
    final = inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(update=inference_pb2.PromptReplace(
        segments=DOCS, final_stage=True)))
    messages = [open_msg("hinted", HEAD), refine, refine2, final, finish_msg(*SUFFIX)]
    answer = collect(inference.stub.StreamPrompt(paced(messages, 0.3), timeout=120))
    assert answer.tokens == reference.tokens
    assert answer.done.stats.num_updates == 3
    # only stable prefixes went ahead, and each later refinement kept them: nothing was invalidated
    assert answer.done.stats.tokens_invalidated == 0
    inference.wait_until_all_blocks_free()


def test_a_stability_hint_out_of_range_is_invalid(inference):
    bad = inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(update=inference_pb2.PromptReplace(
        segments=[hinted(DOCS[0], 1.5)])))
    with pytest.raises(grpc.RpcError) as failure:
        collect(inference.stub.StreamPrompt(iter([open_msg("bad-hint", HEAD), bad, finish_msg(*SUFFIX)]),
                                            timeout=60))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    inference.wait_until_all_blocks_free()


def test_update_changing_a_middle_document_answers_like_generate(inference, reference):
    messages = [open_msg("updates", HEAD), update_msg(DOCS[0], OTHER, DOCS[2]), update_msg(*DOCS),
                finish_msg(*SUFFIX)]
    answer = collect(inference.stub.StreamPrompt(paced(messages, 0.3), timeout=120))
    assert answer.tokens == reference.tokens
    assert answer.done.stats.tokens_invalidated > 0
    assert (answer.done.stats.num_appends, answer.done.stats.num_updates) == (0, 2)
    assert "LIFECYCLE_EVENT_KIND_INVALIDATED" in answer.lifecycle
    inference.wait_until_all_blocks_free()


@pytest.mark.parametrize("eviction", ["recompute", "swap", "cost"])
def test_tiny_device_pool_preempts_yet_answers_like_generate(embedded_model_dir, reference, eviction):
    service = RunningInference(embedded_model_dir, kv_device_blocks=14, kv_cpu_blocks=64, token_budget=32,
                               policy="lcas", eviction=eviction, enable_prefix_cache=False)
    try:
        # 3 contexts need ~18 of the 14 blocks: the engine must evict someone before they all finish.
        answers = held_until_all_prefilled(service.stub, 3, HEAD, DOCS, SUFFIX)
        for rid, answer in answers.items():
            assert answer.tokens == reference.tokens, rid
        counters = service.stats().counters
        assert counters.preemptions_swap + counters.preemptions_recompute > 0
        if eviction == "swap":
            assert counters.preemptions_recompute == 0
        if eviction == "recompute":
            assert counters.preemptions_swap == 0
        service.wait_until_all_blocks_free()
    finally:
        service.stop()


def _cancel_after(call, predicate) -> None:
    for response in call:
        if predicate(response.event):
            call.cancel()
            return


def test_cancel_mid_prefill_frees_every_block(inference):
    released = threading.Event()

    def messages():
        yield open_msg("cancel-prefill", HEAD + DOCS * 8)
        released.wait(30)        # never finish: the request is still prefilling/idle when cancelled

    call = inference.stub.StreamPrompt(messages(), timeout=120)
    with pytest.raises(grpc.RpcError) as err:
        _cancel_after(call, lambda e: e.WhichOneof("kind") == "lifecycle"
                      and e.lifecycle.kind == common_pb2.LIFECYCLE_EVENT_KIND_SCHEDULED)
        next(call)
    assert err.value.code() == grpc.StatusCode.CANCELLED
    released.set()
    inference.wait_until_all_blocks_free()


def test_cancel_mid_decode_frees_every_block(inference):
    call = inference.stub.StreamPrompt(iter([open_msg("cancel-decode", HEAD + DOCS, max_tokens=200, ignore_eos=True),
                                             finish_msg(*SUFFIX)]), timeout=120)
    with pytest.raises(grpc.RpcError) as err:
        _cancel_after(call, lambda e: e.WhichOneof("kind") == "token" and e.token.index >= 3)
        next(call)
    assert err.value.code() == grpc.StatusCode.CANCELLED
    stats = inference.wait_until_all_blocks_free()
    assert stats.counters.requests_aborted >= 1


def test_deadline_passing_aborts_and_frees(inference):
    call = inference.stub.StreamPrompt(iter([open_msg("deadline", HEAD + DOCS, max_tokens=400, ignore_eos=True),
                                             finish_msg(*SUFFIX)]), timeout=1.0)
    with pytest.raises(grpc.RpcError) as err:
        collect(call)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    inference.wait_until_all_blocks_free()


def test_twenty_concurrent_mixed_streams_complete_correctly(inference):
    """Even streams append documents, odd ones send updates; each answer equals Generate's."""
    doc_sets = [[DOCS[i % 3], DOCS[(i + 1) % 3]] if i % 2 == 0 else [OTHER, DOCS[i % 3]] for i in range(20)]
    answers: dict[int, object] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            docs = doc_sets[i]
            appends = [append_msg(d) for d in docs]
            body = appends if i % 2 == 0 else [update_msg(DOCS[0]), update_msg(*docs)]
            messages = [open_msg(f"mix{i}", HEAD, max_tokens=4), *body, finish_msg(*SUFFIX)]
            answers[i] = collect(inference.stub.StreamPrompt(paced(messages, 0.05), timeout=300))
        except BaseException as exc:   # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    expected = {}
    for i, docs in enumerate(doc_sets):
        key = tuple(d.key for d in docs)
        if key not in expected:
            expected[key] = generate(inference.stub, HEAD + docs + SUFFIX, f"mix-ref-{i}", max_tokens=4).tokens
        assert answers[i].tokens == expected[key], i
    inference.wait_until_all_blocks_free()


@pytest.mark.slow   # a minute of a deliberately long step (`bash scripts/test.sh --run-slow`)
def test_get_stats_answers_while_a_long_step_runs(embedded_model_dir):
    """Routers poll GetStats with short deadlines: it must not wait for the engine's step."""
    service = RunningInference(embedded_model_dir, kv_device_blocks=512, token_budget=8192, dtype="bfloat16")
    try:
        long_prompt = [common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=[(i * 7919) % 40000 + 100
                                                                            for i in range(4000)]))]
        call = service.stub.Generate(inference_pb2.GenerateRequest(
            request_id="long", segments=long_prompt, sampling=common_pb2.SamplingParams(max_tokens=1)), timeout=300)
        for response in call:   # QUEUED comes at open; next the engine runs one 4000-token step (seconds)
            if response.event.lifecycle.kind == common_pb2.LIFECYCLE_EVENT_KIND_QUEUED:
                break
        stats = service.stub.GetStats(inference_pb2.GetStatsRequest(), timeout=2).stats
        assert stats.num_active == 1
        collect(call)
    finally:
        service.stop()


def test_done_counts_five_hundred_appends_and_the_updates(inference):
    messages = [open_msg("many-appends", HEAD, max_tokens=2), *(append_msg(seg(f" {i}")) for i in range(500)),
                update_msg(*DOCS), update_msg(DOCS[0]), append_msg(DOCS[1]), finish_msg(*SUFFIX)]
    answer = collect(inference.stub.StreamPrompt(iter(messages), timeout=300))
    assert (answer.done.stats.num_appends, answer.done.stats.num_updates) == (501, 2)
    inference.wait_until_all_blocks_free()


@pytest.fixture(scope="module")
def paris(inference):
    answer = generate(inference.stub, PARIS, "paris-reference", max_tokens=24)
    assert "France" in answer.done.text and "Paris" in answer.done.text, answer.done.text
    return answer


@pytest.mark.parametrize("via", ["generate", "stream"])
def test_a_stop_string_ends_the_answer_where_it_starts(inference, paris, via):
    stop = {"stop": ["Paris", "Berlin"]}
    if via == "generate":
        answer = generate(inference.stub, PARIS, "paris-stop", max_tokens=24, **stop)
    else:
        messages = [open_msg("paris-stop-stream", [], max_tokens=24, **stop), append_msg(*PARIS), finish_msg()]
        answer = collect(inference.stub.StreamPrompt(iter(messages), timeout=120))
    assert answer.done.finish_reason == common_pb2.FINISH_REASON_STOP
    assert answer.done.text == paris.done.text[:paris.done.text.index("Paris")]
    assert answer.text == answer.done.text                    # the token events never ran past it
    assert answer.tokens == paris.tokens[:len(answer.tokens)]  # the same greedy answer, cut short
    inference.wait_until_all_blocks_free()


def test_streamed_tokens_hold_back_a_stop_string_spanning_tokens(inference, paris):
    text = paris.done.text
    stop = text[text.index("France"):text.index("Paris") + 2]   # e.g. "France is Pa": several tokens
    responses = inference.stub.StreamPrompt(iter([open_msg("spanning", PARIS, max_tokens=24, stop=[stop]),
                                                  finish_msg()]), timeout=120)
    streamed = ""
    done = None
    for response in responses:
        event = response.event
        if event.WhichOneof("kind") == "token":
            streamed += event.token.text
            assert "France" not in streamed, streamed   # could still be the stop string: held back
        elif event.WhichOneof("kind") == "done":
            done = event.done
    assert done.finish_reason == common_pb2.FINISH_REASON_STOP
    assert streamed == done.text == text[:text.index("France")]
    inference.wait_until_all_blocks_free()


QUOTE = [seg("<|im_start|>system\nAnswer by quoting the document word for word.<|im_end|>\n<|im_start|>user\n"
             "What does the document say about reading files?\nDocument:\nUse open() to read a file. The with "
             "statement closes the file for you, even when an exception is raised. Mode 'r' reads text and 'rb' "
             "reads bytes.\nQuote the document.<|im_end|>\n<|im_start|>assistant\n")]


def test_speculation_streams_the_same_tokens_and_reports_its_drafts(inference):
    """Speculative decoding (fixed depth, auto) answers token for token like no speculation; the
    done stats and GetStats count the drafted and accepted tokens."""
    plain = generate(inference.stub, QUOTE, "spec-off", max_tokens=24, speculation="off")
    assert plain.done.stats.draft_tokens == 0
    for mode in ("4", "auto"):
        answer = generate(inference.stub, QUOTE, f"spec-{mode}", max_tokens=24, speculation=mode)
        assert answer.tokens == plain.tokens, mode
        assert answer.text == plain.text == answer.done.text
        assert answer.done.stats.accepted_draft_tokens > 0, mode
        assert answer.done.stats.draft_tokens >= answer.done.stats.accepted_draft_tokens
    counters = inference.stub.GetStats(inference_pb2.GetStatsRequest(), timeout=10).stats.counters
    assert counters.accepted_draft_tokens > 0
