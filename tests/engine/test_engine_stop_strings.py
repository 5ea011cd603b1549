"""Stop strings and per-request input counts in the engine, with the real model (SmolLM2-135M,
fp32, greedy): a stop string ends the request with finish reason "stop" where it starts, the
streamed token texts never run past it and add up to the output text."""

from __future__ import annotations

import pytest
import torch

from inference_svc.engine.engine import Engine, EngineConfig
from inference_svc.engine.events import EventKind
from inference_svc.engine.model_runner import ModelRunner
from inference_svc.engine.request import FinishReason, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.tokenization import SegmentTokenizer

PROMPT = [Segment(text="<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
                       "<|im_start|>assistant\n")]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def engine(embedded_model_dir) -> Engine:
    from transformers import AutoTokenizer

    tokenizer = SegmentTokenizer(AutoTokenizer.from_pretrained(str(embedded_model_dir)))
    runner = ModelRunner(embedded_model_dir, dtype=torch.float32, block_size=16, num_device_blocks=64,
                         num_cpu_blocks=16)
    return Engine(runner, tokenizer, EngineConfig(num_device_blocks=64, num_cpu_blocks=16, token_budget=256))


def run(engine: Engine, request_id: str, stop: tuple[str, ...] = ()):
    """Returns (token ids, streamed texts, finished request)."""
    engine.open(request_id, PROMPT, SamplingParams(max_tokens=MAX_TOKENS, stop=stop))
    engine.finish(request_id)
    events = []
    while engine.has_unfinished():
        events += engine.step()
    tokens = [e for e in events if e.request_id == request_id and e.kind is EventKind.TOKEN]
    request = engine.release(request_id)
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks
    return [e.token_id for e in tokens], [e.text for e in tokens], request


@pytest.fixture(scope="module")
def reference(engine):
    tokens, texts, request = run(engine, "reference")
    assert "Paris" in request.output_text, request.output_text
    assert "".join(texts) == request.output_text
    return tokens, request.output_text


def test_a_stop_string_ends_the_answer_where_it_starts(engine, reference):
    ref_tokens, ref_text = reference
    tokens, texts, request = run(engine, "paris", stop=("Paris",))
    assert request.finish_reason is FinishReason.STOP
    assert request.output_text == ref_text[:ref_text.index("Paris")]
    assert "".join(texts) == request.output_text
    assert tokens == ref_tokens[:len(tokens)]          # the same greedy answer, cut short
    assert "Paris" in engine.tokenizer.decode(tokens)  # the token that completed it was generated


def test_streamed_text_holds_back_a_stop_string_spanning_tokens(engine, reference):
    _, ref_text = reference
    stop = ref_text[ref_text.index("France"):ref_text.index("Paris") + 2]   # e.g. "France is Pa"
    _, texts, request = run(engine, "spanning", stop=(stop,))
    assert request.finish_reason is FinishReason.STOP
    assert request.output_text == ref_text[:ref_text.index("France")]
    streamed = ""
    for text in texts:
        streamed += text
        assert "France" not in streamed          # held back while it could be the stop string
    assert streamed == request.output_text


def test_a_stop_string_that_never_appears_changes_nothing(engine, reference):
    ref_tokens, ref_text = reference
    tokens, texts, request = run(engine, "absent", stop=("Berlin", "\n\n\n"))
    assert tokens == ref_tokens and request.output_text == ref_text and "".join(texts) == ref_text


def test_appends_and_updates_are_counted(engine):
    engine.open("counted", [Segment(text="<|im_start|>user\nDocuments:\n")],
                SamplingParams(max_tokens=2))
    for i in range(5):
        engine.append("counted", [Segment(text=f"doc {i}\n")])
        engine.step()
    engine.update("counted", [Segment(text="doc 0\n")])
    engine.update("counted", [Segment(text="doc 1\n")])
    engine.finish("counted", [Segment(text="<|im_end|>\n<|im_start|>assistant\n")])
    while engine.has_unfinished():
        engine.step()
    stats = engine.release("counted").stats
    assert (stats.num_appends, stats.num_updates) == (5, 2)
