"""Sessions on the fake runner: queries fork the session's KV and answer exactly what the whole
prompt would; ingestion, retention, Flash Queries and close keep every block accounted for.
The real model runs the same checks in test_sessions_real_model.py."""

from __future__ import annotations

import pytest

from inference_svc.engine.events import EventKind
from inference_svc.engine.request import FinishReason, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.native.sessions import DataUpdated, FlashAnswer, SessionClosed, SessionFormat, SessionManager
from inference_svc.rpc.errors import SessionError, SessionExists, SessionLimit, SessionNotFound
from tests.engine.engine_helpers import expected_output, fake_engine

FMT = SessionFormat(head_prefix="<sys>", query_suffix="<a>")
GREEDY = SamplingParams(max_tokens=5, speculation="off")


def make(device_blocks=256, **kwargs):
    engine = fake_engine(device_blocks=device_blocks, cpu_blocks=64, policy="fcfs", budget=64)
    notes: list = []
    manager = SessionManager(engine, FMT, notify=lambda sid, event: notes.append((sid, event)),
                             query_room_tokens=kwargs.pop("query_room_tokens", 16), **kwargs)
    return engine, manager, notes


def steps(engine, manager, n=400):
    """Step until nothing is runnable (sessions never finish, so no `run_to_completion`)."""
    events = []
    for _ in range(n):
        if not engine.has_work():
            break
        batch = engine.step()
        manager.observe(None, batch)
        events += batch
    return events


def reference(engine, segments, question, max_tokens=5):
    prompt = engine.tokenizer.encode_all([FMT.head("Be brief."), *map(FMT.data, segments), FMT.query(question)])
    return expected_output(prompt, max_tokens)


def tokens(events, request_id):
    return [e.token_id for e in events if e.request_id == request_id and e.kind is EventKind.TOKEN]


def leak_free(engine):
    kv = engine.scheduler.kv
    kv.check_invariants()
    return kv.device.num_free == kv.device.num_blocks and kv.cpu.num_free == kv.cpu.num_blocks


def data(*texts):
    return [Segment(text=t) for t in texts]


def test_a_query_forks_the_prefilled_session_and_computes_only_its_question():
    engine, manager, _ = make()
    manager.create("s", "Be brief.")
    manager.ingest("s", data("alpha beta gamma", "delta epsilon"))
    steps(engine, manager)
    plan = manager.query("s", "what?", GREEDY, "q1")
    assert plan.data_version == 1 and plan.flash is None
    assert plan.shared_tokens == plan.context_tokens == manager.describe("s").head_tokens + manager.describe(
        "s").data_tokens
    executed = engine.runner.executed_tokens
    events = steps(engine, manager)
    assert tokens(events, "q1") == reference(engine, data("alpha beta gamma", "delta epsilon"), "what?")
    question_tokens = len(engine.tokenizer.encode(FMT.query("what?")))
    # the question, then one token per decode step: never the context
    assert engine.runner.executed_tokens - executed == question_tokens + 4


def test_a_query_during_ingestion_sees_the_latest_prefilled_version_unless_it_asks_for_newer_data():
    engine, manager, notes = make()
    manager.create("s", "Be brief.")
    manager.ingest("s", data("first batch of data"))
    steps(engine, manager)
    first = manager.query("s", "q?", GREEDY, "q1")
    assert manager.ingest("s", data("second batch")) == 2     # while q1 has not run a step
    second = manager.query("s", "q?", GREEDY, "q2")          # the new data is not prefilled yet ...
    fresh = manager.query("s", "q?", GREEDY, "q3", min_version=2)   # ... unless the caller needs it
    assert (first.data_version, second.data_version, fresh.data_version) == (1, 1, 2)
    assert second.shared_tokens == second.context_tokens and fresh.shared_tokens < fresh.context_tokens
    with pytest.raises(SessionError, match="min_data_version 3"):
        manager.query("s", "q?", GREEDY, "q4", min_version=3)
    events = steps(engine, manager)
    assert tokens(events, "q1") == tokens(events, "q2") == reference(engine, data("first batch of data"), "q?")
    assert tokens(events, "q3") == reference(engine, data("first batch of data", "second batch"), "q?")
    assert [e.data_version for _, e in notes if isinstance(e, DataUpdated)] == [1, 2]
    assert manager.query("s", "q?", GREEDY, "q5").data_version == 2     # once it is prefilled


def test_interactive_queries_run_before_ingestion_and_keep_its_share_to_the_reserve():
    engine, manager, _ = make()
    reserve = engine.scheduler.config.speculative_reserve
    manager.create("s", "Be brief.")
    manager.ingest("s", data("x" * 40))
    steps(engine, manager)
    manager.ingest("s", data("y" * 200))          # more than one step of ingestion work
    alone = engine.scheduler.plan(engine.scheduler.rank(0.0))
    assert [n for _, n in alone.chosen] == [engine.scheduler.config.speculative_tokens]
    manager.query("s", "q?", GREEDY, "q1")
    out = engine.scheduler.schedule()
    assert out.chunks[0].request.request_id == "q1"
    assert [chunk.num_tokens for chunk in out.chunks[1:]] == [reserve]


def test_retention_drops_the_oldest_data_and_queries_use_the_old_state_until_the_rebuild_is_ready():
    engine, manager, _ = make()
    manager.create("s", "Be brief.", retention_tokens=30)
    manager.ingest("s", data("a" * 14, "b" * 14))
    steps(engine, manager)
    manager.ingest("s", data("c" * 14))             # 45 > 30: "a..." is dropped
    info = manager.describe("s")
    assert (info.state, info.dropped_segments, info.data_tokens) == ("rebuilding", 1, 30)
    old = manager.query("s", "q?", GREEDY, "q-old")
    assert old.data_version == 1                      # the rebuild is not ready
    events = steps(engine, manager)
    assert tokens(events, "q-old") == reference(engine, data("a" * 14, "b" * 14), "q?")
    assert manager.describe("s").state == "ready"
    new = manager.query("s", "q?", GREEDY, "q-new")
    assert new.data_version == 2 and new.shared_tokens == new.context_tokens
    events = steps(engine, manager)
    assert tokens(events, "q-new") == reference(engine, data("b" * 14, "c" * 14), "q?")
    manager.close("s")
    steps(engine, manager)
    assert leak_free(engine)


def test_flash_queries_are_answered_after_each_batch_and_served_from_the_cache():
    engine, manager, notes = make()
    manager.create("s", "Be brief.")
    manager.register("s", "Is it up?", max_tokens=3)
    manager.ingest("s", data("status: up"))
    steps(engine, manager)
    answers = [e for _, e in notes if isinstance(e, FlashAnswer)]
    assert [a.data_version for a in answers] == [1]
    assert manager.flash_answer("s", "  is IT up? ") == answers[0]
    hit = manager.query("s", "is it up?", GREEDY, "q1")
    assert hit.flash == answers[0] and hit.request_id is None
    manager.ingest("s", data("status: down"))
    assert manager.flash_answer("s", "Is it up?") == answers[0]            # version 2 is not prefilled yet
    assert manager.flash_answer("s", "Is it up?", min_version=2) is None   # stale for version 2
    steps(engine, manager)
    answers = [e for _, e in notes if isinstance(e, FlashAnswer)]
    assert [a.data_version for a in answers] == [1, 2]
    expected = reference(engine, data("status: up", "status: down"), "Is it up?", max_tokens=3)
    assert answers[1].answer == engine.tokenizer.decode(expected)
    assert manager.unregister("s", "IS IT UP?") == []
    assert manager.flash_answer("s", "Is it up?") is None


def test_a_stale_flash_evaluation_is_aborted_when_new_data_arrives():
    engine, manager, notes = make()
    manager.create("s", "Be brief.")
    manager.register("s", "Is it up?", max_tokens=20)
    manager.ingest("s", data("status: up"))
    for _ in range(50):          # until the evaluation has started decoding
        manager.observe(None, engine.step())
        if any(r.request_id.startswith("session:s:flash") and r.output_token_ids for r in engine.requests.values()):
            break
    manager.ingest("s", data("status: down"))
    steps(engine, manager)
    assert [a.data_version for _, a in notes if isinstance(a, FlashAnswer)] == [2]


def test_closing_a_session_aborts_its_queries_and_frees_every_block():
    engine, manager, notes = make()
    manager.create("s", "Be brief.")
    manager.register("s", "Is it up?")
    manager.ingest("s", data("status: up " * 5))
    steps(engine, manager, n=3)
    manager.query("s", "q?", SamplingParams(max_tokens=50, speculation="off"), "q1")
    engine.step()
    info = manager.close("s")
    assert info.active_queries == 1
    events = steps(engine, manager)
    done = [e for e in events + engine.take_events() if e.request_id == "q1" and e.kind is EventKind.FINISHED]
    assert done and done[0].detail == FinishReason.ABORT.value
    assert isinstance(notes[-1][1], SessionClosed)
    assert not manager.exists("s") and leak_free(engine)
    with pytest.raises(SessionNotFound):
        manager.query("s", "q?", GREEDY, "q2")


def test_an_idle_session_can_be_swapped_out_and_a_query_still_answers_exactly():
    engine, manager, _ = make(device_blocks=24)
    manager.create("s", "Be brief.")
    manager.ingest("s", data("m" * 40))
    steps(engine, manager)
    # a long ordinary request needs the whole pool: the idle session is the victim
    engine.open("big", [Segment(text="z" * 80)], SamplingParams(max_tokens=2, speculation="off"))
    engine.finish("big")
    steps(engine, manager)
    assert manager.describe("s").state in ("swapped", "ingesting")
    manager.query("s", "q?", GREEDY, "q1")
    events = steps(engine, manager)
    assert tokens(events, "q1") == reference(engine, data("m" * 40), "q?")


@pytest.mark.parametrize("call, error", [
    (lambda m: m.create("s", "again"), SessionExists),
    (lambda m: m.ingest("nope", data("x")), SessionNotFound),
    (lambda m: m.ingest("s", []), SessionError),
    (lambda m: m.ingest("s", data("")), SessionError),
    (lambda m: m.ingest("s", data("x" * 100)), SessionError),          # longer than the retention
    (lambda m: m.query("s", "   ", GREEDY, "q"), SessionError),
    (lambda m: m.register("s", " ", 3), SessionError),
    (lambda m: m.unregister("s", "never registered"), SessionError),
    (lambda m: m.create("t", "x", retention_tokens=10**6), SessionLimit),
    (lambda m: m.create("t", "x", retention_tokens=-1), SessionError),
])
def test_bad_input_is_refused_and_changes_nothing(call, error):
    engine, manager, _ = make()
    manager.create("s", "Be brief.", retention_tokens=50)
    with pytest.raises(error):
        call(manager)
    assert manager.describe("s").data_version == 0 and list(manager.sessions) == ["s"]
    manager.close("s")
    steps(engine, manager)
    assert leak_free(engine)


def test_too_many_sessions_or_no_room_is_a_limit():
    _, manager, _ = make(max_sessions=2)
    manager.create("a", "x", retention_tokens=10)
    manager.create("b", "x", retention_tokens=10)
    with pytest.raises(SessionLimit, match="too many sessions"):
        manager.create("c", "x", retention_tokens=10)
    _, manager, _ = make(device_blocks=64)        # 64 + 64 blocks of 4 tokens: 512 tokens
    manager.create("a", "x", retention_tokens=200)
    manager.create("b", "x", retention_tokens=200)
    with pytest.raises(SessionLimit, match="no room"):
        manager.create("c", "x", retention_tokens=200)
