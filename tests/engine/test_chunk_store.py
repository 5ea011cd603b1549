"""The chunk KV store (blend mode) over the fake runner, whose "KV" is token ids: a reused passage
shows in the answer if its entry, slots or tier are wrong. Filling, reuse at new positions in
append and update mode, LRU spill to the CPU pool and drops, eviction before preemption, preemption
of blended requests (swap and recompute), cancellation, and no leaked block."""

from __future__ import annotations

import pytest

from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from tests.engine.engine_helpers import expected_output, fake_engine, run_to_completion, tokens_of

DOCS = [Segment(text=f"passage {i}: " + "abcdefghij"[i] * 20 + " ", key=f"doc{i}") for i in range(6)]
HEAD = [Segment(text="Q: why? ")]
SUFFIX = [Segment(text=" A:")]
BLEND = SamplingParams(max_tokens=4, kv_reuse="blend")


def ask(engine, rid, docs, sampling=BLEND, *, update=False):
    engine.open(rid, HEAD, sampling)
    (engine.update if update else engine.append)(rid, docs)
    engine.finish(rid, SUFFIX)


def check_answers(engine, events, rids):
    for rid in rids:
        request = engine.requests[rid]
        assert tokens_of(events, rid) == expected_output(request.prompt_token_ids, request.sampling.max_tokens), rid


def check_no_leak(engine):
    kv = engine.scheduler.kv
    kv.check_invariants()
    held = kv.chunks.blocks_held(False), kv.chunks.blocks_held(True)
    assert kv.device.num_free + held[0] == kv.device.num_blocks
    assert kv.cpu.num_free + held[1] == kv.cpu.num_blocks
    kv.chunks.clear()
    assert kv.device.num_free == kv.device.num_blocks and kv.cpu.num_free == kv.cpu.num_blocks


def test_exact_mode_never_fills_the_store():
    engine = fake_engine()
    ask(engine, "a", DOCS[:3], SamplingParams(max_tokens=4))
    ask(engine, "b", DOCS[2::-1], SamplingParams(max_tokens=4))
    events = run_to_completion(engine)
    check_answers(engine, events, ["a", "b"])
    assert not engine.scheduler.kv.chunks.entries
    assert engine.requests["b"].stats.kv_reuse == "exact" and engine.requests["b"].stats.blend_reused_tokens == 0


def test_with_fill_all_exact_requests_fill_the_store_for_blend_requests_and_read_nothing():
    engine = fake_engine(budget=256, chunk_device_blocks=32, chunk_store_fill="all")
    ask(engine, "exact-1", DOCS[:3], SamplingParams(max_tokens=4))
    events = run_to_completion(engine)
    assert len(engine.scheduler.kv.chunks.entries) == 3          # filled by an exact-mode request
    ask(engine, "exact-2", [DOCS[2], DOCS[0]], SamplingParams(max_tokens=4))
    ask(engine, "blend", [DOCS[3], DOCS[2], DOCS[0]])
    events += run_to_completion(engine)
    check_answers(engine, events, ["exact-1", "exact-2", "blend"])
    exact = engine.requests["exact-2"].stats
    assert (exact.chunk_cache_lookups, exact.blend_reused_tokens) == (0, 0)   # exact never reads it
    blend = engine.requests["blend"].stats
    assert (blend.chunk_cache_lookups, blend.chunk_cache_hits) == (3, 2)
    assert blend.blend_reused_tokens == 2 * len(DOCS[0].text)
    check_no_leak(engine)


def test_a_bad_chunk_store_fill_is_refused():
    with pytest.raises(ValueError, match="chunk_store_fill"):
        fake_engine(chunk_store_fill="sometimes")


@pytest.mark.parametrize("update", [False, True], ids=["append", "update"])
def test_cached_passages_are_reused_at_new_positions(update):
    engine = fake_engine(budget=256, chunk_device_blocks=32)
    ask(engine, "fill", DOCS[:3], update=update)
    events = run_to_completion(engine)
    ask(engine, "moved", [DOCS[3], DOCS[2], DOCS[0]], update=update)
    events += run_to_completion(engine)
    check_answers(engine, events, ["fill", "moved"])
    stats = engine.requests["moved"].stats
    assert (stats.chunk_cache_lookups, stats.chunk_cache_hits) == (3, 2)
    assert stats.blend_reused_tokens == 2 * len(DOCS[0].text)
    check_no_leak(engine)


def test_a_refinement_reuses_the_passages_it_moves():
    """Update mode: a refinement that inserts a passage in front moves the others; they are blended."""
    engine = fake_engine(budget=256, chunk_device_blocks=32)
    engine.open("r", HEAD, BLEND)
    engine.update("r", DOCS[:2])
    events = []
    for _ in range(3):
        events += engine.step()
    engine.update("r", [DOCS[4], DOCS[0], DOCS[1]])
    engine.finish("r", SUFFIX)
    events += run_to_completion(engine)
    check_answers(engine, events, ["r"])
    assert engine.requests["r"].stats.chunk_cache_hits == 2
    check_no_leak(engine)


def test_a_refinement_that_drops_a_passage_reuses_the_survivors_it_shifts():
    """The ANNS shape (update mode, the orchestrator's stable order): a non-final list with stability
    hints is prefilled, the next list drops a middle passage and appends a new one; the survivors after
    the dropped one move left, past the longest common prefix, and are blended from the store."""
    engine = fake_engine(device_blocks=128, budget=256, chunk_device_blocks=64)
    hinted = [Segment(text=d.text, key=d.key, stability=0.85) for d in DOCS[:4]]
    engine.open("r", HEAD, BLEND)
    engine.update("r", hinted, final=False)
    events = []
    for _ in range(3):
        events += engine.step()
    request = engine.requests["r"]
    assert request.num_computed_tokens == request.num_prompt_tokens       # the whole list prefilled
    engine.update("r", [DOCS[0], DOCS[2], DOCS[3], DOCS[4]], final=True)
    kept = request.num_computed_tokens
    survivors_end = request.context_spans[2][1]
    assert kept < request.context_spans[1][1]         # KV kept up to the dropped passage (a few shared tokens)
    engine.finish("r", SUFFIX)
    events += run_to_completion(engine)
    check_answers(engine, events, ["r"])
    stats = request.stats
    assert stats.chunk_cache_hits == 2 and stats.blend_reused_tokens == survivors_end - kept
    check_no_leak(engine)


def test_spill_to_cpu_and_reuse_from_there():
    # 16 device blocks for the store: two passages of 32 tokens (8 blocks of 4 each)
    engine = fake_engine(device_blocks=96, cpu_blocks=64, budget=256, chunk_device_blocks=16)
    ask(engine, "a", DOCS[:2])
    events = run_to_completion(engine)
    ask(engine, "c", DOCS[2:4])
    events += run_to_completion(engine)
    chunks = engine.scheduler.kv.chunks
    assert len(chunks.entries) == 4 and chunks.stats.spills == 2
    on_cpu = [e for e in chunks.entries.values() if e.on_cpu]
    assert len(on_cpu) == 2 and chunks.blocks_held(False) <= 16
    ask(engine, "b", [DOCS[1], DOCS[0]])          # the two least recently used: spilled
    events += run_to_completion(engine)
    check_answers(engine, events, ["a", "c", "b"])
    assert engine.requests["b"].stats.chunk_cache_hits == 2
    check_no_leak(engine)


def test_recompute_eviction_drops_instead_of_spilling():
    engine = fake_engine(device_blocks=96, cpu_blocks=64, budget=256, chunk_device_blocks=16, eviction="recompute")
    ask(engine, "a", DOCS[:2])
    run_to_completion(engine)
    ask(engine, "c", DOCS[2:4])
    events = run_to_completion(engine)
    chunks = engine.scheduler.kv.chunks
    assert chunks.stats.spills == 0 and chunks.stats.drops == 2 and len(chunks.entries) == 2
    check_answers(engine, events, ["c"])
    check_no_leak(engine)


def test_cached_chunks_are_evicted_before_any_request_is_preempted():
    engine = fake_engine(device_blocks=48, cpu_blocks=16, budget=256, chunk_device_blocks=48)
    ask(engine, "a", DOCS[:3])
    events = run_to_completion(engine)
    assert engine.scheduler.kv.chunks.blocks_held(False) == 16      # two passages (the pool had room for two)
    ask(engine, "b", DOCS[2:6], SamplingParams(max_tokens=4))    # exact: needs 35 blocks, 32 are free
    events += run_to_completion(engine)
    check_answers(engine, events, ["a", "b"])
    assert engine.requests["b"].stats.preemptions_swap + engine.requests["b"].stats.preemptions_recompute == 0
    assert engine.scheduler.kv.chunks.stats.spills + engine.scheduler.kv.chunks.stats.drops >= 1
    check_no_leak(engine)


@pytest.mark.parametrize("eviction", ["swap", "recompute"])
def test_blended_requests_survive_preemption(eviction):
    engine = fake_engine(device_blocks=40, cpu_blocks=64, budget=24, eviction=eviction, chunk_device_blocks=16)
    ask(engine, "fill", DOCS[:2])
    events = run_to_completion(engine)
    rids = [f"r{i}" for i in range(4)]
    for i, rid in enumerate(rids):
        ask(engine, rid, [DOCS[(i + 1) % 2], DOCS[2 + i], DOCS[i % 2]])
    events += run_to_completion(engine)
    check_answers(engine, events, ["fill", *rids])
    stats = [engine.requests[r].stats for r in rids]
    assert sum(s.preemptions_swap + s.preemptions_recompute for s in stats) > 0
    assert sum(s.chunk_cache_hits for s in stats) > 0
    check_no_leak(engine)


def test_a_cancelled_blend_request_frees_everything():
    engine = fake_engine(budget=8)
    ask(engine, "fill", DOCS[:2])
    run_to_completion(engine)
    ask(engine, "gone", [DOCS[1], DOCS[0], DOCS[2]])
    for _ in range(3):
        engine.step()
    engine.abort("gone")
    run_to_completion(engine)
    assert engine.scheduler.kv.num_device_blocks("gone") == 0
    check_no_leak(engine)


def test_a_capture_skipped_for_lack_of_free_blocks_is_counted_in_the_stats_and_metrics():
    from inference_svc.native.metrics import StepMetrics
    from inference_svc.rpc.metrics import InferenceMetrics
    from inference_svc.rpc.stats import counters_to_proto

    engine = fake_engine(device_blocks=48, cpu_blocks=16, budget=256, chunk_device_blocks=48)
    ask(engine, "a", DOCS[:3])              # the request's own blocks leave room for two passages' entries
    events = run_to_completion(engine)
    check_answers(engine, events, ["a"])
    chunks = engine.scheduler.kv.chunks
    assert chunks.stats.captures == 2 and len(chunks.entries) == 2
    assert chunks.stats.captures_skipped == 1 == engine.counters.chunk_captures_skipped
    assert counters_to_proto(engine.counters).chunk_captures_skipped == 1          # GetStats
    metrics = InferenceMetrics()
    StepMetrics(metrics).observe(engine, None, [])
    assert metrics.registry.get_sample_value("streamrag_chunk_captures_skipped") == 1
    check_no_leak(engine)


def test_a_store_with_room_skips_no_capture():
    engine = fake_engine(device_blocks=128, budget=256, chunk_device_blocks=64)
    ask(engine, "a", DOCS[:3])
    run_to_completion(engine)
    assert engine.scheduler.kv.chunks.stats.captures == 3 and engine.counters.chunk_captures_skipped == 0
