"""The engine's optional step log (STREAMRAG_STEP_LOG): one line per step naming what it scheduled."""

from __future__ import annotations

import json

from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.step_log import STEP_LOG_ENV
from tests.engine.engine_helpers import fake_engine, run_to_completion


def test_each_step_names_its_requests_and_which_were_complete(tmp_path, monkeypatch):
    monkeypatch.setenv(STEP_LOG_ENV, str(tmp_path / "steps"))
    engine = fake_engine(budget=16, device_blocks=64)
    engine.open("partial", [Segment(text="p" * 40)], SamplingParams(max_tokens=1))
    engine.open("complete", [Segment(text="c" * 20)], SamplingParams(max_tokens=1))
    engine.finish("complete")
    engine.step()
    engine.finish("partial")
    prompt = engine.requests["partial"].num_prompt_tokens
    run_to_completion(engine)
    (log,) = tmp_path.glob("steps.*.jsonl")
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(steps) == engine.counters.steps
    first = steps[0]
    assert first["complete"] == ["complete"]
    assert set(first["scheduled"]) == {"complete", "partial"}
    assert first["tokens_complete"] == first["scheduled"]["complete"]
    assert first["tokens_partial"] == first["scheduled"]["partial"]
    assert sum(s["scheduled"].get("partial", 0) for s in steps) == prompt   # its prefill, one token sampled
    assert all("partial" in s["complete"] for s in steps[1:] if "partial" in s["scheduled"])


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(STEP_LOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    engine = fake_engine(budget=16, device_blocks=64)
    assert engine.step_log is None
    engine.open("r", [Segment(text="x" * 10)], SamplingParams(max_tokens=1))
    engine.finish("r")
    run_to_completion(engine)
    assert not list(tmp_path.iterdir())


def test_time_in_the_garbage_collector_is_reported_with_the_next_step(tmp_path):
    import gc

    from inference_svc.engine.step_log import StepLog

    with open(tmp_path / "steps.jsonl", "w", encoding="utf-8") as stream:
        log = StepLog(stream)
        try:
            log.write(0.0, {}, [])
            gc.collect(2)
            gc.collect(0)
            log.write(1.0, {}, [])
            log.write(2.0, {}, [])
        finally:
            log.close()
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [line["gc_gen2"] for line in lines] == [0, 1, 0]
    assert lines[1]["gc_ms"] > 0 and lines[2]["gc_ms"] == 0
    assert log._on_gc not in gc.callbacks
