"""Speculative decoding with the real model (SmolLM2-135M-Instruct, fp32): greedy answers are
token-identical with speculation off, at fixed depths and auto, also under preemption and after
an update, drafts are really accepted on an answer that quotes its context, and no KV block
leaks after rollbacks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inference_svc.engine.engine import Engine, EngineConfig
from inference_svc.engine.model_runner import ModelRunner
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.tokenization import SegmentTokenizer
from tests.engine.engine_helpers import run_to_completion, tokens_of

HEAD = [Segment(text="<|im_start|>system\nAnswer by quoting the document word for word.<|im_end|>\n"
                     "<|im_start|>user\nWhat does the document say about reading files?\nDocument:\n")]
DOCS = [
    Segment(key="files", text="Use open() to read a file. The with statement closes the file for you, even when an "
                              "exception is raised. Mode 'r' reads text and 'rb' reads bytes.\n"),
    Segment(key="io", text="The io module provides buffered streams. read() returns the whole content, readline() "
                           "one line, and iterating over a file yields its lines.\n"),
]
OTHER = Segment(key="dicts", text="A dict maps keys to values; get() returns a default for a missing key.\n")
SUFFIX = [Segment(text="Quote the document.<|im_end|>\n<|im_start|>assistant\n")]
MAX_TOKENS = 24
MODES = ["off", "2", "8", "auto"]


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return SegmentTokenizer(AutoTokenizer.from_pretrained(str(embedded_model_dir)))


@pytest.fixture(scope="module")
def runner(embedded_model_dir):
    """One fp32 runner with room for every test's pool (its KV is only ever read through block tables)."""
    return ModelRunner(embedded_model_dir, dtype=torch.float32, block_size=16, num_device_blocks=256,
                       num_cpu_blocks=256)


def make_engine(runner, tokenizer, *, device_blocks=256, eviction="cost", policy="fcfs", budget=256,
                prefix_cache=True) -> Engine:
    return Engine(runner, tokenizer, EngineConfig(num_device_blocks=device_blocks, num_cpu_blocks=256,
                                                  token_budget=budget, policy=policy, eviction=eviction,
                                                  enable_prefix_cache=prefix_cache))


def params(speculation: str) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, speculation=speculation)


def assert_no_leaks(engine: Engine) -> None:
    kv = engine.scheduler.kv
    kv.check_invariants()
    assert kv.device.num_free == kv.device.num_blocks
    assert kv.cpu.num_free == kv.cpu.num_blocks


@pytest.fixture(scope="module")
def reference(runner, tokenizer):
    engine = make_engine(runner, tokenizer, budget=2048)
    engine.open("ref", HEAD + DOCS, params("off"))
    engine.finish("ref", SUFFIX)
    tokens = tokens_of(run_to_completion(engine), "ref")
    assert engine.counters.draft_tokens == 0
    return tokens


@pytest.mark.parametrize("speculation", MODES[1:])
def test_greedy_answer_is_token_identical_with_speculation(runner, tokenizer, reference, speculation):
    engine = make_engine(runner, tokenizer)
    engine.open("s", HEAD + DOCS, params(speculation))
    engine.finish("s", SUFFIX)
    assert tokens_of(run_to_completion(engine), "s") == reference
    stats = engine.requests["s"].stats
    assert stats.draft_tokens > 0 and stats.accepted_draft_tokens > 0, "the quoting answer accepted no draft"
    assert_no_leaks(engine)


def test_streamed_update_then_speculation_gives_the_one_shot_answer(runner, tokenizer, reference):
    engine = make_engine(runner, tokenizer, budget=48)
    engine.open("u", HEAD, params("auto"))
    engine.update("u", [DOCS[0], OTHER])
    events = []
    for _ in range(4):
        events += engine.step()
    engine.update("u", DOCS)
    assert engine.requests["u"].stats.tokens_invalidated > 0
    engine.finish("u", SUFFIX)
    assert tokens_of(run_to_completion(engine, events=events), "u") == reference
    assert engine.requests["u"].stats.accepted_draft_tokens > 0
    assert_no_leaks(engine)


@pytest.mark.parametrize("eviction", ["recompute", "swap"])
def test_preempted_speculating_requests_give_the_same_answer(runner, tokenizer, reference, eviction):
    # Three 111-token prompts growing by 24 tokens (9 blocks each at the end) in 20 blocks, no
    # prefix sharing: decoding requests with drafts between their steps get preempted.
    engine = make_engine(runner, tokenizer, device_blocks=20, eviction=eviction, policy="default", budget=128,
                         prefix_cache=False)
    events = []
    modes = ["4", "auto", "off"]
    for i, mode in enumerate(modes):
        engine.open(f"p{i}", HEAD + DOCS, params(mode))
        engine.finish(f"p{i}", SUFFIX)
    run_to_completion(engine, events=events)
    for i, mode in enumerate(modes):
        assert tokens_of(events, f"p{i}") == reference, f"p{i} ({mode})"
    counters = engine.counters
    assert counters.preemptions_swap + counters.preemptions_recompute > 0
    assert counters.accepted_draft_tokens > 0
    assert_no_leaks(engine)


def test_cancelling_a_speculating_request_frees_its_blocks(runner, tokenizer):
    engine = make_engine(runner, tokenizer)
    engine.open("c", HEAD + DOCS, params("8"))
    engine.finish("c", SUFFIX)
    for _ in range(200):
        engine.step()
        if engine.requests["c"].stats.draft_tokens:
            break
    engine.abort("c")
    engine.step()
    assert engine.requests["c"].is_finished
    assert_no_leaks(engine)


def test_seeded_sampling_gives_the_same_tokens_with_speculation(runner, tokenizer):
    """With a seed, each emitted token is one draw of the request's generator from the same logits,
    so speculation changes nothing at temperature > 0 either."""
    answers = {}
    for mode in ("off", "4"):
        engine = make_engine(runner, tokenizer)
        engine.open("t", HEAD + DOCS, dataclasses.replace(params(mode), temperature=0.7, seed=3))
        engine.finish("t", SUFFIX)
        answers[mode] = tokens_of(run_to_completion(engine), "t")
        assert_no_leaks(engine)
    assert answers["4"] == answers["off"]
