"""Blend mode with the real model (SmolLM2-135M-Instruct, fp32): a cached passage reused at a new
position. The keys are re-rotated exactly (layer 0 equals a fresh prefill there), fraction 1 gives
a fresh prefill's KV and the exact answer, fraction 0 gives exactly the cached KV, and no blended KV
ever reaches an exact request through the prefix cache."""

from __future__ import annotations

import pytest
import torch

from inference_svc.engine.blend import rotate_keys, token_slots
from inference_svc.engine.engine import Engine, EngineConfig
from inference_svc.engine.model_runner import ChunkInput, ModelRunner
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.tokenization import SegmentTokenizer
from tests.engine.engine_helpers import run_to_completion, tokens_of
from tests.engine.test_engine_real_model import DOCS, HEAD, OTHER, SUFFIX

MAX_TOKENS = 12
BS = 16


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return SegmentTokenizer(AutoTokenizer.from_pretrained(str(embedded_model_dir)))


def make_engine(model_dir, tokenizer, **config) -> Engine:
    runner = ModelRunner(model_dir, dtype=torch.float32, block_size=BS, num_device_blocks=256, num_cpu_blocks=64)
    return Engine(runner, tokenizer, EngineConfig(num_device_blocks=256, num_cpu_blocks=64, block_size=BS,
                                                  token_budget=2048, **config))


def prompt_kv(engine: Engine, rid: str) -> torch.Tensor:
    """The request's KV of its prompt positions, all layers: [layers, 2, tokens, heads, dim]."""
    request = engine.requests[rid]
    slots = token_slots(engine.scheduler.block_table(request), 0, request.num_prompt_tokens, BS)
    pool = engine.runner.kv_cache.device_pool
    flat = pool.view(pool.shape[0], 2, -1, *pool.shape[4:])
    return flat.index_select(2, slots).clone()


def ask(engine: Engine, rid: str, docs, sampling: SamplingParams, steps: int | None = None):
    engine.open(rid, HEAD, sampling)
    engine.append(rid, docs)
    engine.finish(rid, SUFFIX)
    if steps is None:
        return tokens_of(run_to_completion(engine), rid)
    events = []
    for _ in range(steps):
        events += engine.step()
    return tokens_of(events, rid)


def blend(fraction: float, max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, kv_reuse="blend", blend_recompute=fraction)


MOVED = [OTHER, DOCS[2], DOCS[0], DOCS[1]]     # every cached passage at a new position


def test_rotated_keys_equal_a_fresh_prefill_at_the_new_position(embedded_model_dir, tokenizer):
    """Layer 0's keys depend only on the token and its position: the cached keys rotated by the
    position delta equal the keys a fresh prefill computes at the new position."""
    runner = ModelRunner(embedded_model_dir, dtype=torch.float32, block_size=BS, num_device_blocks=64,
                         num_cpu_blocks=0)
    doc = tokenizer.encode(DOCS[0])
    head_a, head_b = tokenizer.encode(HEAD[0]), tokenizer.encode_all(HEAD) + tokenizer.encode(OTHER)
    table_a, table_b = list(range(0, 32)), list(range(32, 64))
    runner.execute([ChunkInput(head_a + doc, 0, table_a, False)])
    runner.execute([ChunkInput(head_b + doc, 0, table_b, False)])
    keys = runner.kv_cache.layers[0][0]
    cached = keys[token_slots(table_a, len(head_a), len(doc), BS)]
    fresh = keys[token_slots(table_b, len(head_b), len(doc), BS)]
    delta = len(head_b) - len(head_a)
    assert delta > 0
    assert not torch.allclose(cached, fresh, atol=1e-3)          # the positions differ ...
    torch.testing.assert_close(rotate_keys(cached, delta, runner.model.rotary.inv_freq), fresh,
                               atol=2e-5, rtol=1e-5)             # ... and the rotation closes the gap


def test_fraction_one_gives_fresh_kv_and_the_exact_answer(embedded_model_dir, tokenizer):
    engine = make_engine(embedded_model_dir, tokenizer)
    exact = make_engine(embedded_model_dir, tokenizer)
    ask(engine, "fill", DOCS, blend(1.0))
    assert len(engine.scheduler.kv.chunks.entries) == len(DOCS)
    assert ask(engine, "moved", MOVED, blend(1.0, 2), steps=1)      # prefilled, one token out
    assert ask(exact, "ref", MOVED, SamplingParams(max_tokens=2), steps=1)
    stats = engine.requests["moved"].stats
    assert stats.chunk_cache_hits == len(DOCS) and stats.blend_reused_tokens == stats.blend_recomputed_tokens > 0
    torch.testing.assert_close(prompt_kv(engine, "moved"), prompt_kv(exact, "ref"), atol=1e-4, rtol=1e-4)
    run_to_completion(engine)
    run_to_completion(exact)
    reference = ask(exact, "ref2", MOVED, SamplingParams(max_tokens=MAX_TOKENS))
    assert ask(engine, "moved2", MOVED, blend(1.0)) == reference
    assert engine.requests["moved2"].stats.kv_reuse == "blend"


def test_fraction_zero_reuses_exactly_the_cached_kv(embedded_model_dir, tokenizer):
    engine = make_engine(embedded_model_dir, tokenizer)
    ask(engine, "fill", DOCS, blend(0.0))
    chunks = engine.scheduler.kv.chunks
    entry = chunks.entries[tuple(tokenizer.encode(DOCS[0]))]
    pool = engine.runner.kv_cache.device_pool
    flat = pool.view(pool.shape[0], 2, -1, *pool.shape[4:])
    cached = flat.index_select(2, token_slots(entry.blocks, 0, len(entry.token_ids), BS)).clone()
    ask(engine, "moved", MOVED, blend(0.0, 2), steps=1)
    request = engine.requests["moved"]
    start = next(a for a, b in request.context_spans if request.prompt_token_ids[a:b] == list(entry.token_ids))
    got = prompt_kv(engine, "moved")[:, :, start:start + len(entry.token_ids)]
    assert start != entry.position
    assert torch.equal(got[:, 1], cached[:, 1])                                   # values as cached
    assert torch.equal(got[:, 0], rotate_keys(cached[:, 0], start - entry.position,
                                              engine.runner.model.rotary.inv_freq))   # keys only re-rotated
    assert request.stats.blend_recomputed_tokens == 0
    assert request.stats.blend_reused_tokens == sum(len(tokenizer.encode(d)) for d in DOCS)
    run_to_completion(engine)


def test_blended_kv_never_reaches_an_exact_request(embedded_model_dir, tokenizer):
    """An exact request after a blended one with the same prompt gets the exact answer: the prefix
    cache holds only blocks before the first blended token."""
    engine = make_engine(embedded_model_dir, tokenizer)
    exact = make_engine(embedded_model_dir, tokenizer)
    reference = ask(exact, "ref", MOVED, SamplingParams(max_tokens=MAX_TOKENS))
    ask(engine, "fill", DOCS, blend(0.0))
    ask(engine, "moved", MOVED, blend(0.0))
    first_blended = engine.requests["moved"].context_spans[1][0]
    assert ask(engine, "exact", MOVED, SamplingParams(max_tokens=MAX_TOKENS)) == reference
    stats = engine.requests["exact"].stats
    assert stats.kv_reuse == "exact" and stats.blend_reused_tokens == 0
    assert stats.prefix_cache_hit_tokens <= first_blended


def test_default_fraction_mostly_agrees_with_exact(embedded_model_dir, tokenizer):
    engine = make_engine(embedded_model_dir, tokenizer, kv_reuse="blend")   # the engine's default mode and share
    exact = make_engine(embedded_model_dir, tokenizer)
    reference = ask(exact, "ref", MOVED, SamplingParams(max_tokens=MAX_TOKENS))
    ask(engine, "fill", DOCS, SamplingParams(max_tokens=2))
    got = ask(engine, "moved", MOVED, SamplingParams(max_tokens=MAX_TOKENS))
    stats = engine.requests["moved"].stats
    assert stats.kv_reuse == "blend" and 0 < stats.blend_recomputed_tokens < stats.blend_reused_tokens
    assert got[:4] == reference[:4]
    engine.scheduler.kv.check_invariants()
