"""Random interleavings of session calls and ordinary requests on the fake runner: every answer
equals the reference answer for the prompt it saw, and every block is accounted for at every
step and free once everything is closed. The fake runner's KV stores token ids, so a query that
forked stale, foreign or overwritten KV answers differently."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from inference_svc.engine.engine import EngineInputError
from inference_svc.engine.events import EventKind
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.rpc.errors import SessionLimit
from tests.engine.engine_helpers import expected_output
from tests.engine.test_sessions import FMT, leak_free, make, steps, tokens

MAX_TOKENS = 4


def run_interleaving(rnd: random.Random) -> None:
    engine, manager, _ = make(device_blocks=rnd.choice([48, 96, 256]), query_room_tokens=rnd.choice([8, 40]))
    expected: dict[str, list[int]] = {}      # request id -> the prompt it must answer
    events: list = []
    serial = 0

    def sampling():
        return SamplingParams(max_tokens=MAX_TOKENS, speculation=rnd.choice(["off", "auto"]))

    for _ in range(60):
        serial += 1
        op = rnd.random()
        session_ids = list(manager.sessions)
        if op < 0.1 and len(session_ids) < 3:
            try:
                manager.create(f"s{serial}", "Be brief.", retention_tokens=rnd.choice([30, 60, 0]))
            except SessionLimit:      # no room left in the pools
                continue
            if rnd.random() < 0.5:
                manager.register(f"s{serial}", "flash?", max_tokens=3)
        elif op < 0.45 and session_ids:
            batch = ["".join(rnd.choice("abcdef ") for _ in range(rnd.randint(3, 20))) + "x"
                     for _ in range(rnd.randint(1, 3))]
            manager.ingest(rnd.choice(session_ids), [Segment(text=t) for t in batch])
        elif op < 0.7 and session_ids:
            session = manager.sessions[rnd.choice(session_ids)]
            min_version = rnd.choice([0, session.version])
            state, _, context = session.visible(engine.requests, min_version)
            prompt = engine.requests[state.request_id].prompt_token_ids[:context] + engine.tokenizer.encode(
                FMT.query("what?"))
            try:
                manager.query(session.session_id, "what?", sampling(), f"q{serial}", min_version)
            except EngineInputError as exc:       # the question does not fit beside the data
                assert "too long" in str(exc)
                continue
            expected[f"q{serial}"] = prompt
        elif op < 0.85:          # an ordinary request, often on a session's prefix (prefix-cache reuse)
            if session_ids and rnd.random() < 0.7:
                state = engine.requests[manager.sessions[rnd.choice(session_ids)].state.request_id]
                prompt = state.prompt_token_ids + engine.tokenizer.encode(FMT.query("other?"))
            else:
                prompt = engine.tokenizer.encode(Segment(text="zz" * rnd.randint(3, 30)))
            try:
                engine.open(f"g{serial}", [Segment(token_ids=tuple(prompt))], sampling())
            except EngineInputError as exc:
                assert "too long" in str(exc)
                continue
            engine.finish(f"g{serial}")
            expected[f"g{serial}"] = prompt
        elif op < 0.9 and session_ids:
            manager.close(rnd.choice(session_ids))
        for _ in range(rnd.randint(0, 4)):
            if engine.has_work():
                batch = engine.step()
                manager.observe(None, batch)
                events += batch
        engine.scheduler.kv.check_invariants()
    events += steps(engine, manager, 3000) + engine.take_events()
    for request_id, prompt in expected.items():
        finished = [e for e in events if e.request_id == request_id and e.kind is EventKind.FINISHED]
        assert finished, request_id
        if finished[0].detail == "abort":           # its session was closed
            continue
        answer, reference = tokens(events, request_id), expected_output(prompt, MAX_TOKENS)
        if finished[0].detail == "length":          # the sequence hit the pool's size
            reference = reference[:len(answer)]
        assert answer == reference, request_id
    manager.close_all("test over")
    steps(engine, manager)
    assert leak_free(engine)


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False))
def test_random_session_traffic_answers_exactly_and_leaks_nothing(rnd):
    run_interleaving(rnd)
