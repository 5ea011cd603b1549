"""Steps bounded in time with the real model (SmolLM2-135M-Instruct, fp32): the greedy answer is the
one-shot answer token for token, every step holds at most the tokens the step-time model allows (read
from the step log, never from the clock), and a cancel that arrives while a long prompt's prefill step
runs frees its blocks before the next step, which already serves the request that arrived beside it."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch

from inference_svc.engine.cost_model import CostModel, PiecewiseLinear
from inference_svc.engine.engine import Engine, EngineConfig
from inference_svc.engine.events import EventKind
from inference_svc.engine.model_runner import ModelRunner
from inference_svc.engine.request import RequestState, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.step_budget import StepScale
from inference_svc.engine.step_log import STEP_LOG_ENV
from inference_svc.engine.tokenization import SegmentTokenizer
from inference_svc.native.engine_thread import EngineThread
from tests.engine.engine_helpers import run_to_completion, tokens_of

HEAD = [Segment(text="<|im_start|>system\nAnswer using the documents.<|im_end|>\n<|im_start|>user\n"
                     "Question: how do I read a file in Python?\nDocuments:\n")]
DOC = ("The with statement closes the file for you, even when an exception is raised. Mode 'r' reads text "
       "and 'rb' reads bytes; read() returns the whole content, readline() one line, and iterating over a "
       "file yields its lines. ")
LONG = HEAD + [Segment(key=f"doc-{i}", text=f"[doc {i}] {DOC}\n") for i in range(9)]   # about 560 tokens
SHORT = [*HEAD, Segment(text="[doc] Use open() to read a file.\n")]
SUFFIX = [Segment(text="<|im_end|>\n<|im_start|>assistant\n")]
MAX_TOKENS = 4
# The injected model: a step costs 10 ms plus 1 ms per token, wherever the tokens sit in their prompts,
# so a 250 ms step holds 240 tokens.
LINEAR = CostModel(PiecewiseLinear([0, 100_000], [10.0, 100_010.0]), PiecewiseLinear([0, 1024], [0.05, 20.5]))
TARGET_MS, MODEL_BUDGET = 250.0, 240


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return SegmentTokenizer(AutoTokenizer.from_pretrained(str(embedded_model_dir)))


def make_engine(model_dir, tokenizer, *, target_ms=None, cost_model=None, budget=2048) -> Engine:
    runner = ModelRunner(model_dir, dtype=torch.float32, block_size=16, num_device_blocks=256, num_cpu_blocks=64)
    return Engine(runner, tokenizer, EngineConfig(num_device_blocks=256, num_cpu_blocks=64, token_budget=budget,
                                                  step_time_target_ms=target_ms), cost_model)


def frozen(engine: Engine) -> Engine:
    """No online refit: every budget is the injected model's alone, whatever the clock says."""
    engine.step_budget.scale = StepScale(alpha=0.0)
    return engine


@pytest.fixture(scope="module")
def reference(embedded_model_dir, tokenizer):
    """Each prompt's greedy answer, the whole prompt in one step (the fixed 2,048-token budget)."""
    engine = make_engine(embedded_model_dir, tokenizer)
    answers = {}
    for name, prompt in (("long", LONG), ("short", SHORT)):
        engine.open(name, prompt, SamplingParams(max_tokens=MAX_TOKENS))
        engine.finish(name, SUFFIX)
        answers[name] = tokens_of(run_to_completion(engine), name)
        assert answers[name]
    assert engine.requests["long"].num_prompt_tokens > 2 * MODEL_BUDGET
    return answers


def read_steps(tmp_path) -> list[dict]:
    (log,) = tmp_path.glob("steps.*.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_bounded_steps_keep_the_greedy_answer_and_the_model_s_budget(embedded_model_dir, tokenizer, reference,
                                                                     tmp_path, monkeypatch):
    monkeypatch.setenv(STEP_LOG_ENV, str(tmp_path / "steps"))
    engine = frozen(make_engine(embedded_model_dir, tokenizer, target_ms=TARGET_MS, cost_model=LINEAR))
    engine.open("long", LONG, SamplingParams(max_tokens=MAX_TOKENS))
    engine.finish("long", SUFFIX)
    events = engine.step()                                  # the long prompt's first chunk
    engine.open("short", SHORT, SamplingParams(max_tokens=MAX_TOKENS))
    engine.finish("short", SUFFIX)
    run_to_completion(engine, events=events)
    assert tokens_of(events, "long") == reference["long"]
    assert tokens_of(events, "short") == reference["short"]
    engine.step_log.close()
    steps = read_steps(tmp_path)
    prefill = [s for s in steps if "predicted_ms" in s]
    assert len(prefill) >= 3                                # the long prompt took several steps
    for step in steps:
        assert sum(step["scheduled"].values()) <= step["budget"]
    for step in prefill:
        assert step["budget"] == MODEL_BUDGET
        assert step["predicted_ms"] <= TARGET_MS
    assert max(sum(s["scheduled"].values()) for s in prefill) == MODEL_BUDGET
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks


def test_online_refit_keeps_the_greedy_answer(embedded_model_dir, tokenizer, reference, tmp_path, monkeypatch):
    """The refit moves the budget with measured step times (the clock): the answer does not move."""
    monkeypatch.setenv(STEP_LOG_ENV, str(tmp_path / "steps"))
    engine = make_engine(embedded_model_dir, tokenizer, target_ms=TARGET_MS, budget=512)
    engine.open("long", LONG, SamplingParams(max_tokens=MAX_TOKENS))
    engine.finish("long", SUFFIX)
    assert tokens_of(run_to_completion(engine), "long") == reference["long"]
    engine.step_log.close()
    steps = read_steps(tmp_path)
    assert all(sum(s["scheduled"].values()) <= s["budget"] <= 512 for s in steps)
    assert engine.step_budget.scale.samples == sum(1 for s in steps if "predicted_ms" in s) > 0


def test_a_cancel_mid_prefill_frees_the_blocks_before_the_next_step(embedded_model_dir, tokenizer, reference):
    """The cancel and a new request arrive while the long prompt's second prefill step runs: before the
    next step the long request is finished (not waiting) and holds no block; that next step already
    serves the new request, whose answer is its one-shot answer."""
    engine = frozen(make_engine(embedded_model_dir, tokenizer, target_ms=TARGET_MS, cost_model=LINEAR))
    seen: list[tuple[int | None, int, list]] = []          # (step or None for commands, steps so far, events)
    done = threading.Event()
    state = {}

    def on_step(seconds, events):
        seen.append((seconds, engine.counters.steps, events))
        for event in events:
            if event.request_id == "long" and event.kind is EventKind.FINISHED:
                long = engine.requests["long"]
                state.update(steps=engine.counters.steps, blocks=engine.scheduler.kv.num_device_blocks("long"),
                             state=long.state, waiting=[r.request_id for r in engine.requests.values()
                                                        if r.state is RequestState.WAITING and r.request_id != "new"])
            if event.request_id == "new" and event.kind is EventKind.FINISHED:
                done.set()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        thread = EngineThread(engine, on_step)
        execute, calls = engine.runner.execute, []

        async def arrive() -> None:
            thread.submit(lambda e: (e.open("new", SHORT, SamplingParams(max_tokens=MAX_TOKENS)),
                                     e.finish("new", SUFFIX)))

        def execute_and_cancel(chunks):
            calls.append(engine.counters.steps + 1)         # the step in flight
            if len(calls) == 2:                             # the long prompt's second chunk is computing
                thread.abort_soon("long")                   # as the servicer does when the call is cancelled
                asyncio.run_coroutine_threadsafe(arrive(), loop).result(timeout=60)
            return execute(chunks)

        engine.runner.execute = execute_and_cancel
        thread.start()
        try:
            await thread.call(lambda e: (e.open("long", LONG, SamplingParams(max_tokens=MAX_TOKENS)),
                                         e.finish("long", SUFFIX)))
            assert await loop.run_in_executor(None, done.wait, 240), "the new request did not finish"
        finally:
            thread.stop()
        state["cancel_step"] = calls[1]

    asyncio.run(scenario())
    assert state["steps"] == state["cancel_step"], "a step ran between the cancel and the abort"
    assert state["blocks"] == 0 and state["state"] is RequestState.FINISHED and not state["waiting"]
    next_step = next(events for seconds, steps, events in seen if seconds is not None and steps == state["steps"] + 1)
    assert any(e.request_id == "new" and e.kind is EventKind.FIRST_TOKEN for e in next_step)
    events = [e for _, _, batch in seen for e in batch]
    assert tokens_of(events, "new") == reference["short"]
    assert not tokens_of(events, "long")
    assert engine.counters.requests_aborted == 1
    assert "long" not in engine.requests
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks
