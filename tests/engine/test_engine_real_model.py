"""The engine with the real model (SmolLM2-135M-Instruct, fp32): streamed input gives the
same greedy answer as the whole prompt at once, also under preemption in every eviction mode,
and no KV block leaks. (fp32 is where exactness holds; bf16 chunked prefill may round
differently from one-shot.)"""

from __future__ import annotations

import pytest
import torch

from inference_svc.engine.engine import Engine, EngineConfig
from inference_svc.engine.model_runner import ModelRunner
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.tokenization import SegmentTokenizer
from tests.engine.engine_helpers import run_to_completion, tokens_of

HEAD = [Segment(text="<|im_start|>system\nAnswer using the documents.<|im_end|>\n<|im_start|>user\n"),
        Segment(text="Question: how do I read a file in Python?\nDocuments:\n")]
DOCS = [
    Segment(key="files", text="[files] Use open() to read a file. The with statement closes the file for you, "
                              "even when an exception is raised. Mode 'r' reads text and 'rb' reads bytes.\n"),
    Segment(key="lists", text="[lists] A list is a mutable sequence. append() adds an item at the end, "
                              "sort() sorts the list in place and len() gives its length.\n"),
    Segment(key="io", text="[io] The io module provides buffered streams. read() returns the whole content, "
                           "readline() one line, and iterating over a file yields its lines.\n"),
]
OTHER = Segment(key="dicts", text="[dicts] A dict maps keys to values; get() returns a default for a missing key.\n")
SUFFIX = [Segment(text="<|im_end|>\n<|im_start|>assistant\n")]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return SegmentTokenizer(AutoTokenizer.from_pretrained(str(embedded_model_dir)))


def make_engine(model_dir, tokenizer, *, device_blocks=256, eviction="cost", policy="fcfs", budget=64,
                prefix_cache=True) -> Engine:
    runner = ModelRunner(model_dir, dtype=torch.float32, block_size=16, num_device_blocks=device_blocks,
                         num_cpu_blocks=256)
    return Engine(runner, tokenizer, EngineConfig(num_device_blocks=device_blocks, num_cpu_blocks=256,
                                                  token_budget=budget, policy=policy, eviction=eviction,
                                                  enable_prefix_cache=prefix_cache))


@pytest.fixture(scope="module")
def reference(embedded_model_dir, tokenizer):
    engine = make_engine(embedded_model_dir, tokenizer, budget=2048)
    engine.open("ref", HEAD + DOCS, SamplingParams(max_tokens=MAX_TOKENS))
    engine.finish("ref", SUFFIX)
    tokens = tokens_of(run_to_completion(engine), "ref")
    assert len(tokens) == MAX_TOKENS or tokens[-1] in engine.runner.eos_token_ids
    return tokens


def test_streamed_appends_give_the_one_shot_answer(embedded_model_dir, tokenizer, reference):
    engine = make_engine(embedded_model_dir, tokenizer)
    engine.open("s", HEAD, SamplingParams(max_tokens=MAX_TOKENS))
    events = []
    for doc in DOCS:
        engine.append("s", [doc])
        for _ in range(3):
            events += engine.step()
    assert not tokens_of(events, "s"), "decoded before finish"
    engine.finish("s", SUFFIX)
    assert tokens_of(run_to_completion(engine, events=events), "s") == reference
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks


def test_update_replacing_a_middle_document_gives_the_one_shot_answer(embedded_model_dir, tokenizer, reference):
    engine = make_engine(embedded_model_dir, tokenizer)
    engine.open("u", HEAD, SamplingParams(max_tokens=MAX_TOKENS))
    engine.update("u", [DOCS[0], OTHER, DOCS[2]])
    events = []
    for _ in range(8):
        events += engine.step()
    engine.update("u", DOCS)
    assert engine.requests["u"].stats.tokens_invalidated > 0
    engine.finish("u", SUFFIX)
    assert tokens_of(run_to_completion(engine, events=events), "u") == reference


@pytest.mark.parametrize("eviction", ["recompute", "swap", "cost"])
def test_preempted_streams_still_give_the_one_shot_answer(embedded_model_dir, tokenizer, reference, eviction):
    # No prefix sharing here, so the three identical streams really compete for 24 blocks.
    engine = make_engine(embedded_model_dir, tokenizer, device_blocks=24, eviction=eviction, policy="lcas", budget=48,
                         prefix_cache=False)
    events = []
    for i in range(3):
        engine.open(f"p{i}", HEAD, SamplingParams(max_tokens=MAX_TOKENS))
    for doc in DOCS:
        for i in range(3):
            engine.append(f"p{i}", [doc])
            events += engine.step()
    for i in range(3):
        engine.finish(f"p{i}", SUFFIX)
    run_to_completion(engine, events=events)
    for i in range(3):
        assert tokens_of(events, f"p{i}") == reference, f"p{i}"
    counters = engine.counters
    assert counters.preemptions_swap + counters.preemptions_recompute > 0
    if eviction == "swap":
        assert counters.preemptions_recompute == 0
    if eviction == "recompute":
        assert counters.preemptions_swap == 0
    engine.scheduler.kv.check_invariants()
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks
    assert engine.scheduler.kv.cpu.num_free == engine.scheduler.kv.cpu.num_blocks
