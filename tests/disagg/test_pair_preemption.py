"""A prefill/decode pair under memory pressure on both sides (fp32, the real model): three streamed
prompts whose contexts do not fit the small pools together. Each side preempts (swap or
recompute, as the eviction policy decides), the decode side may decline imports and compute those
tokens itself, and every answer still equals `Generate` token for token, with no block leaked on
either side."""

from __future__ import annotations

import pytest

from protos.metadata import DECODE_TARGET_KEY
from tests.disagg.test_transfer import check_pool, generate
from tests.support.inference import RunningInference
from tests.support.inference_calls import DOCS, HEAD, SUFFIX, held_until_all_prefilled

POOL = dict(kv_device_blocks=14, kv_cpu_blocks=64, token_budget=32, policy="lcas", enable_prefix_cache=False,
            max_streams=16)
REQUESTS = 3          # 3 contexts take about 18 of a side's 14 blocks


@pytest.fixture(scope="module", params=["recompute", "swap"])
def small_pair(request, embedded_model_dir):
    prefill = RunningInference(embedded_model_dir, role="prefill", eviction=request.param, **POOL)
    decode = RunningInference(embedded_model_dir, role="decode", eviction=request.param, **POOL)
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
    # Every context is held open until all of them were prefilled once: together they need more
    # blocks than either side has, so both must have preempted someone by then.
    answers = held_until_all_prefilled(prefill.stub, REQUESTS, HEAD, DOCS, SUFFIX, max_tokens=24,
                                       prefix="pressure-", metadata=((DECODE_TARGET_KEY, decode.address),))
    assert len(answers) == REQUESTS
    for rid, answer in answers.items():
        assert answer.tokens == want.tokens, rid
        assert "LIFECYCLE_EVENT_KIND_KV_HANDOFF" in answer.lifecycle, rid      # decoded over there
        assert "LIFECYCLE_EVENT_KIND_KV_TRANSFER_FALLBACK" not in answer.lifecycle, rid
    assert _preemptions(prefill) > before[0]
    assert _preemptions(decode) > before[1]
    check_pool(prefill)
    check_pool(decode)
