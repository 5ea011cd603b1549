"""`Engine.last_step`: one frozen snapshot of what the last step did, replaced after every step."""

from __future__ import annotations

import dataclasses

import pytest

from inference_svc.engine.engine import StepStats
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from tests.engine.engine_helpers import fake_engine
from tests.engine.test_speculation import PROMPT, quoting


def test_each_step_replaces_the_snapshot_and_none_is_changed_in_place():
    engine = fake_engine(predict=quoting, budget=64)
    assert engine.last_step == StepStats()
    engine.open("r", [Segment(token_ids=PROMPT)], SamplingParams(max_tokens=20, speculation="4"))
    engine.finish("r")
    seen = []
    while engine.has_unfinished():
        engine.step()
        assert not seen or engine.last_step is not seen[-1]
        seen.append(engine.last_step)
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[-1].tokens = 0
    assert seen[0].tokens == len(PROMPT) and seen[0].decode_tokens == 0 and seen[0].emitted == 1
    drafting = [s for s in seen if s.depths]
    assert drafting, "the quoting model's answer is drafted"
    assert all(s.draft_tokens == sum(s.depths) and s.decode_tokens == s.tokens for s in drafting)
    assert sum(s.draft_tokens for s in seen) == engine.counters.draft_tokens
    assert sum(s.emitted for s in seen) == 20
