"""A prefill/decode pair under memory pressure on both sides (fp32, the real model): three streamed
prompts whose contexts do not fit the small pools together. Each side preempts (swap or
recompute, as the eviction policy decides), the decode side may decline imports and compute those
tokens itself, and every answer still equals `Generate` token for token, with no block leaked on
either side."""

from __future__ import annotations

import threading

import pytest

from protos import common_pb2
from protos.metadata import DECODE_TARGET_KEY
from tests.disagg.conftest import RunningReplica
from tests.disagg.test_transfer import DOCS, HEAD, SUFFIX, check_pool, generate
from tests.service.inference_harness import append_msg, collect, finish_msg, open_msg

POOL = dict(kv_device_blocks=14, kv_cpu_blocks=64, token_budget=32, policy="lcas", enable_prefix_cache=False,
            max_streams=16)
REQUESTS = 3          # 3 contexts take about 18 of a side's 14 blocks


@pytest.fixture(scope="module", params=["recompute", "swap"])
def small_pair(request, embedded_model_dir):
    prefill = RunningReplica(embedded_model_dir, role="prefill", eviction=request.param, **POOL)
    decode = RunningReplica(embedded_model_dir, role="decode", eviction=request.param, **POOL)
    yield prefill, decode
    prefill.stop()
    decode.stop()


def _preemptions(replica) -> int:
    counters = replica.stats().counters
    return counters.preemptions_swap + counters.preemptions_recompute


def test_pairs_under_preemption_on_both_sides_answer_like_generate(small_pair):
    prefill, decode = small_pair
    want = generate(prefill.stub, HEAD + DOCS + SUFFIX, "reference-pressure")
    before = _preemptions(prefill), _preemptions(decode)
    prefilled = [threading.Event() for _ in range(REQUESTS)]
    answers: dict[int, object] = {}

    def messages(i: int):
        yield open_msg(f"pressure-{i}", HEAD, max_tokens=24)
        for doc in DOCS:
            yield append_msg(doc)
        # Hold every context open until all of them were prefilled once: together they need more
        # blocks than either side has, so both must have preempted someone by then.
        for event in prefilled:
            event.wait(120)
        yield finish_msg(*SUFFIX)

    def run(i: int) -> None:
        responses = prefill.stub.StreamPrompt(messages(i), timeout=300,
                                              metadata=((DECODE_TARGET_KEY, decode.address),))

        def watch():
            for response in responses:
                event = response.event
                if (event.WhichOneof("kind") == "lifecycle"
                        and event.lifecycle.kind == common_pb2.LIFECYCLE_EVENT_KIND_KV_ON_GPU):
                    prefilled[i].set()
                yield response

        answers[i] = collect(watch())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(REQUESTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(REQUESTS):
        assert answers[i].tokens == want.tokens, i
        assert "LIFECYCLE_EVENT_KIND_KV_HANDOFF" in answers[i].lifecycle, i      # decoded over there
        assert "LIFECYCLE_EVENT_KIND_KV_TRANSFER_FALLBACK" not in answers[i].lifecycle, i
    assert _preemptions(prefill) > before[0]
    assert _preemptions(decode) > before[1]
    check_pool(prefill)
    check_pool(decode)
