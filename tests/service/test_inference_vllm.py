"""The black-box Inference service tests against the vLLM backend (`--backend vllm`, fp32 so
streamed and one-shot answers agree exactly within the backend).

    /opt/vllm-venv/bin/python -m pytest --run-vllm -m vllm tests/service/test_inference_vllm.py
    STREAMRAG_VLLM_TEST_POLICY=lcas /opt/vllm-venv/bin/python -m pytest --run-vllm -m vllm \
        tests/service/test_inference_vllm.py      # the same tests under another policy

The streaming, cancellation and bad-input tests are the native suite's own functions, imported
here so they run with this module's `inference` fixture. Left out, being about the native
engine's internals: the tiny-pool preemption tests, GetStats during a long native step, and the
max-streams tests (which start native services; the stream-slot code is shared), and the
500-appends count test (500 session turns; the counting is the same one line as for one append).
The empty-suffix
test is replaced by a vLLM variant (vLLM's prefix cache makes "prompt tokens computed" a poor
signal that the head was prefilled).
"""

from __future__ import annotations

import os
import threading

import pytest

from protos import common_pb2, inference_pb2
from tests.service.test_inference_bad_input import (  # noqa: F401 - collected and run here
    SMALL_PROMPT,
    assert_healthy,
    baseline,
    gated,
    test_a_prompt_too_long_is_answered_the_same_whichever_limit_it_hits,
    test_bad_input_is_rejected_and_harmless,
    test_duplicate_request_id_while_first_is_open,
    test_undecodable_request_bytes_get_invalid_argument,
    test_unknown_policy_hint_is_accepted_and_logged,
    test_valid_stream_undisturbed_by_concurrent_hostile_calls,
)
from tests.service.test_inference_streaming import (  # noqa: F401 - collected and run here
    paris,
    reference,
    test_a_stop_string_ends_the_answer_where_it_starts,
    test_cancel_mid_decode_frees_every_block,
    test_cancel_mid_prefill_frees_every_block,
    test_deadline_passing_aborts_and_frees,
    test_generate_answers_with_stats,
    test_seeded_sampling_streamed_answers_like_generate,
    test_stability_hinted_refinements_answer_like_generate,
    test_streamed_appends_answer_like_generate,
    test_streamed_tokens_hold_back_a_stop_string_spanning_tokens,
    test_twenty_concurrent_mixed_streams_complete_correctly,
    test_update_changing_a_middle_document_answers_like_generate,
)
from tests.service.test_refusal_status import (  # noqa: F401 - collected and run here
    test_a_huge_request_id_is_invalid_argument_on_every_call_while_the_client_writes,
    test_a_second_open_is_invalid_argument_on_every_call_while_the_client_writes,
)
from tests.support.inference import InferenceProcess
from tests.support.inference_calls import collect, finish_msg, open_msg

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def inference(embedded_model_dir):
    # STREAMRAG_VLLM_TEST_POLICY: run the same black-box tests under another policy (default fcfs:
    # our scheduler class; `default`: vLLM's own scheduler)
    service = InferenceProcess(embedded_model_dir, backend="vllm", max_streams=48,
                                   policy=os.environ.get("STREAMRAG_VLLM_TEST_POLICY", "fcfs"))
    yield service
    service.stop()


def test_describe_reports_vllm_and_answers_sensibly(inference):
    info = inference.stub.Describe(inference_pb2.DescribeRequest(), timeout=10).model_info
    assert (info.backend, info.eviction_mode, info.context_length, info.vocab_size) == ("vllm", "recompute", 8192,
                                                                                        49152)
    chat = info.chat_format
    prompt = chat.prompt_prefix + chat.user_prefix + "What is the capital of France?" + chat.user_suffix
    prompt += chat.assistant_prefix
    answer = collect(inference.stub.Generate(inference_pb2.GenerateRequest(
        request_id="paris", segments=[common_pb2.Segment(text=prompt)],
        sampling=common_pb2.SamplingParams(max_tokens=12)), timeout=120))
    assert "Paris" in answer.done.text
    assert answer.text == answer.done.text
    stats = inference.wait_until_all_blocks_free()
    assert stats.pools[0].total_blocks > 0 and stats.counters.prompt_tokens_computed > 0


def test_empty_suffix_after_the_head_was_prefilled_answers_like_generate(inference, baseline):  # noqa: F811
    """`finish` with no segments once the whole prompt was submitted as the session's first turn:
    the backend resubmits the complete prompt (served from the prefix cache)."""
    gate = threading.Event()
    scheduled = threading.Event()
    messages = gated([open_msg("empty-suffix-vllm", SMALL_PROMPT, max_tokens=3)], gate, [finish_msg()])

    def watch(responses):
        for response in responses:
            if response.event.lifecycle.kind == common_pb2.LIFECYCLE_EVENT_KIND_SCHEDULED:
                scheduled.set()
            yield response

    result = {}
    thread = threading.Thread(target=lambda: result.setdefault(
        "answer", collect(watch(inference.stub.StreamPrompt(messages, timeout=60)))))
    thread.start()
    try:
        assert scheduled.wait(60), "the head was never prefilled"
    finally:
        gate.set()
        thread.join(60)
    assert result["answer"].tokens == baseline.tokens
    assert_healthy(inference, baseline)
