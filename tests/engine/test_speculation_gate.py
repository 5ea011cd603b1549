"""The speculation gate (speculation/gate.py): auto drafts are capped, then turned off, where the
measured decode throughput with drafts falls below the throughput without; they come back when a
probe pays. The observations are fed by hand (batch, drafted tokens, emitted tokens, step ms)."""

from __future__ import annotations

from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.speculation import GateSettings, SpeculationGate
from tests.engine.engine_helpers import expected_output, fake_engine, run_to_completion, tokens_of
from tests.engine.test_speculation import PROMPT, quoting

SETTINGS = GateSettings(min_samples=3, probe_after=8, max_probe_after=16, reference_age=1000)
PLAIN_MS = 100.0


def plain(gate: SpeculationGate, batch: int = 8, steps: int = 1) -> None:
    for _ in range(steps):
        gate.observe(batch, 0, batch, PLAIN_MS)


def drafted(gate: SpeculationGate, emitted: int, ms: float, batch: int = 8, steps: int = 3, depth: int = 2) -> None:
    """`steps` steps in which every request verified a draft of `depth` tokens."""
    for _ in range(steps):
        gate.observe(batch, depth * batch, emitted, ms, drafting=batch)


def test_drafts_that_cost_go_shallower_then_off():
    gate = SpeculationGate(SETTINGS)
    assert gate.cap(8) == 0, "no plain step timed yet: the next one is plain"
    plain(gate)
    caps = [gate.cap(8)]
    for _ in range(4):
        drafted(gate, emitted=8, ms=120.0, depth=caps[-1] or 8)   # the same tokens in 20% more time: 0.83x
        caps.append(gate.cap(8))
    assert caps == [None, 4, 2, 1, 0]
    assert gate.cap(1) == 0, "a batch size far from 8 has no reference yet"
    plain(gate, batch=1)
    assert gate.cap(1) is None, "and its own cap"


def test_a_cap_that_would_not_change_the_drafts_is_skipped():
    gate = SpeculationGate(SETTINGS)
    plain(gate)
    drafted(gate, emitted=8, ms=120.0, depth=2)    # uncapped, the drafts were 2 deep: cap 2 changes nothing
    assert gate.cap(8) == 1
    drafted(gate, emitted=8, ms=120.0, depth=1)
    assert gate.cap(8) == 0


def test_drafts_that_pay_keep_no_cap_and_a_stale_reference_times_a_plain_step():
    gate = SpeculationGate(GateSettings(min_samples=3, reference_age=5))
    plain(gate)
    drafted(gate, emitted=14, ms=110.0, steps=4)    # 1.59x
    assert gate.cap(8) is None and gate.gain(8) > 1.5
    drafted(gate, emitted=14, ms=110.0, steps=1)
    assert gate.cap(8) == 0, "five steps since the last plain one: time one again"
    plain(gate)
    assert gate.cap(8) is None


def test_off_probes_after_a_while_and_comes_back_when_drafts_pay():
    gate = SpeculationGate(SETTINGS)
    plain(gate)
    drafted(gate, emitted=8, ms=120.0, depth=1)   # one-token drafts that cost: off at once
    assert gate.cap(8) == 0
    plain(gate, steps=SETTINGS.probe_after - 1)
    assert gate.cap(8) == 0
    plain(gate)
    assert gate.cap(8) == 1, "a probe at the shallowest cap"
    caps = []
    for _ in range(3):
        drafted(gate, emitted=12, ms=102.0)    # the workload now quotes: 1.47x
        caps.append(gate.cap(8))
    assert caps == [2, 4, None]


def test_a_failed_probe_waits_twice_as_long_for_the_next():
    gate = SpeculationGate(SETTINGS)
    plain(gate)
    drafted(gate, emitted=8, ms=120.0, depth=1)   # one-token drafts that cost: off at once
    plain(gate, steps=SETTINGS.probe_after)
    assert gate.cap(8) == 1
    drafted(gate, emitted=8, ms=120.0)         # the probe does not pay
    assert gate.cap(8) == 0
    plain(gate, steps=SETTINGS.probe_after)
    assert gate.cap(8) == 0, "the second probe waits twice as long"
    plain(gate, steps=SETTINGS.probe_after)
    assert gate.cap(8) == 1


def test_a_cap_just_left_for_being_slow_is_not_raised_back_into():
    gate = SpeculationGate(SETTINGS)
    plain(gate)
    drafted(gate, emitted=8, ms=120.0, depth=8)    # uncapped costs
    assert gate.cap(8) == 4
    drafted(gate, emitted=14, ms=100.0, depth=4)   # 4 pays well, but "no cap" was just left
    assert gate.cap(8) == 4


NEVER_PAYS = GateSettings(floor=1000.0, raise_at=1000.0, min_samples=2, probe_after=10_000, max_probe_after=10_000)


def test_an_engine_whose_drafts_never_pay_stops_drafting_and_answers_the_same():
    engine = fake_engine(predict=quoting, budget=64, speculation_gate=NEVER_PAYS)
    engine.open("r", [Segment(token_ids=PROMPT)], SamplingParams(max_tokens=160, speculation="auto"))
    engine.finish("r")
    depths, events = [], []
    while engine.has_unfinished():
        events.extend(engine.step())
        depths.append(engine.last_step.depths)
    assert tokens_of(events, "r") == expected_output(list(PROMPT), 160, quoting)
    assert any(depths), "auto drafts at first"
    assert not any(depths[-20:]), "then the gate turned it off"
    ungated = fake_engine(predict=quoting, budget=64, speculation_gate=None)
    ungated.open("r", [Segment(token_ids=PROMPT)], SamplingParams(max_tokens=160, speculation="auto"))
    ungated.finish("r")
    assert tokens_of(run_to_completion(ungated), "r") == tokens_of(events, "r")
    assert ungated.requests["r"].stats.draft_tokens > engine.requests["r"].stats.draft_tokens


def test_steps_verifying_fixed_depth_drafts_are_not_judged():
    engine = fake_engine(predict=quoting, budget=64, speculation_gate=NEVER_PAYS)
    engine.open("r", [Segment(token_ids=PROMPT)], SamplingParams(max_tokens=40, speculation="4"))
    engine.finish("r")
    run_to_completion(engine)
    assert engine.counters.draft_tokens > 0
    assert engine.speculation.gate.gain(1) is None
