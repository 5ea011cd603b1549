"""Speculative decoding (speculation.py) over the fake runner: the n-gram proposer, the adaptive
depth, verification; greedy output identical whatever the mode, rollback leaves no block behind,
preemption with drafts in flight, the token budget counts verification tokens, and sampling at
temperature > 0 keeps its distribution (a tiny-vocabulary Markov model, fixed seed)."""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from inference_svc.engine.engine import Engine, EngineConfig, EngineInputError
from inference_svc.engine.kv_manager import blocks_for
from inference_svc.engine.model_runner import ChunkInput
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.speculation import DepthController, DepthSettings, NgramProposer, verify
from inference_svc.engine.tokenization import SegmentTokenizer
from tests.engine.engine_helpers import BLOCK, capture_plans, expected_output, fake_engine, run_to_completion, tokens_of
from tests.engine.fake_runner import CharTokenizer, next_token

PERIOD = 7
PROMPT = tuple(range(10, 10 + PERIOD)) * 3 + (10, 11)


def quoting(context) -> int:
    """A model that quotes: repeats the token PERIOD back, except at every fifth position."""
    if len(context) % 5 == 0 or len(context) < PERIOD:
        return next_token(context)
    return context[-PERIOD]


def greedy(mode: str, max_tokens: int = 24) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, speculation=mode)


# --- the parts ---------------------------------------------------------------------------
def test_proposer_drafts_what_followed_the_longest_most_recent_match():
    p = NgramProposer((3, 2, 1))
    p.extend([1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3])
    assert p.propose(2) == [5, 6]          # "2 3" last seen before "5 6"; no 3-gram "6 2 3" earlier
    p.extend([4])
    assert p.propose(3) == [9, 2, 3]       # the 3-gram "2 3 4" wins over shorter ones
    assert p.propose(0) == []
    q = NgramProposer((2,))
    q.extend([1, 2, 3])
    assert q.propose(4) == []              # "2 3" never occurred before
    q.sync([7, 7, 7, 7])                   # tokens that do not extend the seen ones: rebuilt
    assert q.propose(2) == [7]


def test_verify_accepts_while_the_model_agrees():
    assert verify([5, 6, 7], [5, 6, 8, 9].__getitem__) == [5, 6, 8]     # 2 accepted, 8 corrects
    assert verify([5, 6], [5, 6, 1].__getitem__) == [5, 6, 1]           # all accepted plus the bonus
    assert verify([5], [4, 5].__getitem__) == [4]                       # rejected at once


def test_auto_depth_follows_acceptance_and_load_and_probes_after_a_collapse():
    settings = DepthSettings(max_depth=8, cost_ratio=0.25, probe_every=4, probe_depth=2)
    fixed = DepthController(3, settings)
    assert [fixed.depth(load=0.95) for _ in range(3)] == [3, 3, 3]
    auto = DepthController(None, settings)
    # priors p1 = p = 0.5, cost 0.25 / 1.25: 0.5 ** 2 > 0.2 > 0.5 ** 3
    assert auto.depth() == 2
    for _ in range(20):
        auto.observe(8, 8)                             # every draft accepted whole
    assert auto.acceptance > 0.95
    assert auto.depth(load=0.0) == 8
    assert auto.depth(load=0.0, share=3) == 3          # its share of the draft budget
    for _ in range(20):
        auto.observe(5, 4)                             # 4 accepted, then a rejection: p1 -> 1, p -> 3 / 4
    assert abs(auto.acceptance - 0.75) < 0.01 and auto.first_acceptance > 0.99
    assert auto.depth(load=0.0) == 6                   # 0.75 ** 5 > 0.2 > 0.75 ** 6
    assert auto.depth(load=0.4) == 3                   # prefill took 40% of the last step: dearer tokens (0.52)
    # in a batch whose last step emitted 16 tokens out of 32 computed, a draft token delays them all:
    # cost 0.25 * 16 / (1 + 0.25 * 32) = 0.44, 0.75 ** 2 > 0.44 > 0.75 ** 3
    assert auto.depth(load=0.0, batch_emitted=16, batch_tokens=32) == 3
    quoting = DepthController(None, settings)          # bimodal: wrong at once, or a whole quote
    for _ in range(10):
        quoting.observe(8, 0)
        quoting.observe(8, 8)
    assert 0.4 < quoting.first_acceptance < 0.7 and quoting.acceptance > 0.95
    assert quoting.depth() == 8                        # a geometric p ~ 0.5 would have said 2
    for _ in range(20):
        auto.observe(4, 0)                             # every draft rejected at once
    assert auto.collapsed
    depths = [auto.depth() for _ in range(8)]
    assert depths.count(0) == 6 and depths.count(2) == 2       # a probe every 4th step
    for _ in range(4):
        auto.observe(2, 2)                             # the probes succeed: it recovers
    assert not auto.collapsed and auto.depth() >= 1


def test_an_unknown_mode_or_a_depth_out_of_range_is_refused():
    engine = fake_engine()
    for bad in ("-1", "17", "eagle", "", "4.5"):
        with pytest.raises(EngineInputError, match="speculation"):
            engine.open("r", [Segment(text="hi")], greedy(bad))
    assert not engine.requests


# --- the engine ---------------------------------------------------------------------------
@pytest.mark.parametrize("predict", [next_token, quoting], ids=["hash-model", "quoting-model"])
@pytest.mark.parametrize("mode", ["off", "1", "4", "16", "auto"])
def test_greedy_output_is_identical_whatever_the_speculation(predict, mode):
    engine = fake_engine(predict=predict)
    engine.open("r", [Segment(token_ids=PROMPT)], greedy(mode))
    engine.finish("r")
    events = run_to_completion(engine)
    assert tokens_of(events, "r") == expected_output(list(PROMPT), 24, predict)
    stats = engine.requests["r"].stats
    if mode == "off":
        assert stats.draft_tokens == 0
    elif predict is quoting:
        assert stats.accepted_draft_tokens > 0
    assert engine.counters.generated_tokens == 24


def test_rollback_frees_the_blocks_of_rejected_drafts():
    engine = fake_engine(predict=quoting, device_blocks=64)
    kv = engine.scheduler.kv
    for i, mode in enumerate(("8", "16", "auto")):
        engine.open(f"r{i}", [Segment(token_ids=PROMPT[i:])], greedy(mode, 40))
        engine.finish(f"r{i}")
    while engine.has_unfinished():
        engine.step()
        kv.check_invariants()
        for request in engine.requests.values():
            if not request.is_finished and request.output_token_ids:
                # exactly the blocks of the computed tokens: nothing held for rejected drafts
                assert kv.num_device_blocks(request.request_id) == blocks_for(request.num_computed_tokens, BLOCK)
    drafted, accepted = engine.counters.draft_tokens, engine.counters.accepted_draft_tokens
    assert 0 < accepted < drafted, "the scenario must both accept and reject drafts"
    assert kv.device.num_free == kv.device.num_blocks
    for i in range(3):
        assert engine.requests[f"r{i}"].output_token_ids == expected_output(list(PROMPT[i:]), 40, quoting)


@pytest.mark.parametrize("eviction", ["swap", "recompute"])
def test_preemption_with_drafts_in_flight_keeps_every_answer(eviction):
    # 14 blocks of 4 tokens for four 23-token prompts growing by 30 tokens: decoding requests get preempted.
    engine = fake_engine(predict=quoting, device_blocks=14, eviction=eviction, budget=24, enable_prefix_cache=False)
    prompts = {f"p{i}": list(PROMPT[i:]) for i in range(4)}
    for i, rid in enumerate(prompts):
        engine.open(rid, [Segment(token_ids=tuple(prompts[rid]))], greedy(("4", "auto", "16", "off")[i], 30))
        engine.finish(rid)
    events = run_to_completion(engine)
    for rid, prompt in prompts.items():
        assert tokens_of(events, rid) == expected_output(prompt, 30, quoting), rid
    counters = engine.counters
    assert counters.preemptions_swap + counters.preemptions_recompute > 0
    assert counters.accepted_draft_tokens > 0
    engine.scheduler.kv.check_invariants()
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks
    assert engine.scheduler.kv.cpu.num_free == engine.scheduler.kv.cpu.num_blocks


def test_verification_tokens_count_in_the_budget_and_never_displace_prefill():
    engine = fake_engine(predict=quoting, budget=12)
    engine.open("d", [Segment(token_ids=PROMPT)], greedy("16", 60))
    engine.finish("d")
    for _ in range(4):
        engine.step()
    engine.open("long", [Segment(token_ids=tuple(range(20, 80)))], greedy("off", 2))
    engine.finish("long")
    outputs = capture_plans(engine)
    run_to_completion(engine)
    assert any(chunk.draft for out in outputs for chunk in out.chunks)
    for out in outputs:
        assert out.num_tokens <= 12
        prefill = [c for c in out.chunks if c.request.request_id == "long" and not c.wants_logits]
        if prefill and prefill[0].start + prefill[0].num_tokens < prefill[0].request.num_prompt_tokens:
            assert not any(c.draft for c in out.chunks)  # the budget cut the prefill: no draft got in


def test_cancelling_a_request_with_drafts_frees_its_blocks():
    engine = fake_engine(predict=quoting)
    engine.open("c", [Segment(token_ids=PROMPT)], greedy("8", 200))
    engine.finish("c")
    while not engine.requests["c"].stats.draft_tokens:
        engine.step()
    engine.abort("c")
    kv = engine.scheduler.kv
    kv.check_invariants()
    assert kv.device.num_free == kv.device.num_blocks


# --- sampling at temperature > 0 -------------------------------------------------------------
TINY_VOCAB = 5          # token 0 is EOS (never drawn); 1..4 are the language
MARKOV = torch.tensor([  # P(next | last), rows by the last token
    [0.25, 0.25, 0.25, 0.25],
    [0.10, 0.60, 0.20, 0.10],
    [0.30, 0.10, 0.50, 0.10],
    [0.40, 0.30, 0.20, 0.10],
    [0.20, 0.20, 0.20, 0.40],
])


class MarkovRunner:
    """Logits from a first-order Markov chain over a tiny vocabulary: each row depends only on the
    token it follows, so a drafted position gets the logits it would get without speculation."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(max_position_embeddings=4096, vocab_size=TINY_VOCAB)
        self.synchronous = True
        self.eos_token_ids = (0,)

    def execute(self, chunks: list[ChunkInput]) -> torch.Tensor:
        rows = []
        for chunk in chunks:
            if chunk.want_logits:
                for token in chunk.token_ids[len(chunk.token_ids) - chunk.num_logits:]:
                    rows.append(torch.cat([torch.tensor([-math.inf]), MARKOV[token].log()]))
        return torch.stack(rows) if rows else torch.empty(0, TINY_VOCAB)

    def swap_out(self, pairs) -> None: ...
    def swap_in(self, pairs) -> None: ...
    def copy_blocks(self, pairs) -> None: ...


def second_tokens(mode: str, n: int) -> Counter:
    """(first, second) output tokens of `n` sampled requests: the second is the first the
    verification step emits (with speculation on, every request drafts after its first token)."""
    torch.manual_seed(1234)
    engine = Engine(MarkovRunner(), SegmentTokenizer(CharTokenizer()),
                    EngineConfig(num_device_blocks=4096, num_cpu_blocks=16, block_size=4, token_budget=4096,
                                 max_running=512, draft_ngram_sizes=(1,), draft_budget=4096))
    for i in range(n):
        engine.open(f"s{i}", [Segment(token_ids=(1, 2, 3, 4, 1, 2, 3, 4))],
                    SamplingParams(temperature=1.0, max_tokens=3, speculation=mode))
        engine.finish(f"s{i}")
    while engine.has_unfinished():
        engine.step()
    if mode != "off":
        assert engine.counters.draft_tokens >= n      # every request verified a draft
        assert 0 < engine.counters.accepted_draft_tokens < engine.counters.draft_tokens
    return Counter(tuple(r.output_token_ids[:2]) for r in engine.requests.values())


def joint(pairs: Counter, n: int) -> torch.Tensor:
    return torch.tensor([[pairs[(a, b)] / n for b in range(1, TINY_VOCAB)] for a in range(1, TINY_VOCAB)])


def test_first_speculative_token_has_the_non_speculative_distribution():
    """The joint distribution of (first token, first verified token) against the chain's own,
    P(a | last prompt token) * P(b | a), and against sampling without speculation."""
    n = 4000
    first = MARKOV[4]                                   # the prompt ends with token 4
    expected = first[:, None] * MARKOV[1:]
    off, spec = joint(second_tokens("off", n), n), joint(second_tokens("3", n), n)
    # total variation distances; about 0.03 is expected from sampling noise at this n
    assert 0.5 * (off - expected).abs().sum() < 0.06
    assert 0.5 * (spec - expected).abs().sum() < 0.06
    assert 0.5 * (spec - off).abs().sum() < 0.08
