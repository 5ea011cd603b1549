"""`bench chaos`'s logic without services: the fault schedule, its flags, and how failures,
recoveries and lost events are attributed to fault windows."""

from __future__ import annotations

import argparse

import pytest

from load_tests.chaos import faults, report, run
from load_tests.chaos.faults import FaultPlan, FaultRecord
from load_tests.chaos.observers import LostEvents
from load_tests.chaos.workload import AskOutcome, AskSpec, CallOutcome, ask_mix


def test_the_default_schedule_kills_each_target_in_turn_then_stops_each():
    plans = faults.schedule(600, 60)
    assert [p.at_s for p in plans] == [30 + 60 * i for i in range(10)]
    assert [(p.action, p.target) for p in plans] == [
        ("kill", "inference-0"), ("kill", "anns"), ("kill", "crawler"), ("kill", "orchestrator"), ("kill", "redis"),
        ("stop", "inference-0"), ("stop", "anns"), ("stop", "crawler"), ("stop", "orchestrator"), ("stop", "redis")]


def test_named_faults_are_taken_in_order_and_cycled():
    plans = faults.schedule(120, 60, faults.parse_faults("kill:inference-0, stop:anns"))
    assert [(p.action, p.target, p.at_s) for p in plans] == [("kill", "inference-0", 30), ("stop", "anns", 90)]
    assert [p.target for p in faults.schedule(200, 40, [("kill", "redis")])] == ["redis"] * 5


@pytest.mark.parametrize("text", ["", "kill", "explode:redis", "kill:", ","])
def test_a_bad_fault_list_is_refused_by_name(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"ACTION:SERVICE|no faults"):
        run.fault_list(text)


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600), ("90s", 90), ("45", 45), ("1.5m", 90), ("1h", 3600)])
def test_durations(text, seconds):
    assert run.duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "-3s", "ten minutes", "5d"])
def test_a_bad_duration_is_an_argparse_error(text):
    with pytest.raises(argparse.ArgumentTypeError):
        run.duration(text)


def test_the_question_set_is_every_retriever_streamed_and_not_in_a_seeded_order():
    specs = ask_mix(["q1", "q2"], seed=3)
    assert len(specs) == len(set(specs)) == 12
    assert specs == ask_mix(["q1", "q2"], seed=3) and specs != ask_mix(["q1", "q2"], seed=4)


def ask(start, end, ok=True, code="", retrieved=("anns",), replica="r0", request_id="", answer="a", sources=("d1",)):
    outcome = AskOutcome(0, AskSpec("q", "anns", True), start, end, deadline_s=60.0, ok=ok, code=code,
                         replica=replica, request_id=request_id, answer=answer, sources=sources)
    outcome.retrieved_from = retrieved
    return outcome


def summary(asks, records, lost=(), calls=()):
    answers = report.compare_answers([], asks)
    return report.summarize(list(asks), list(calls), records, list(lost), {"inference-0": {"held": {}}}, answers,
                            {"inference-0": "r0", "inference-1": "r1"}, 0.0, 200.0, {})


def record(action, target, started, healthy, probe=None):
    """A fault; `probe`: (start, end) of the first probe ask answered after it."""
    ok, answered = probe or (None, None)
    return FaultRecord(FaultPlan(action, target, started), started=started, healthy=healthy, probe_ok=ok,
                       probe_answered=answered)


def test_failures_are_attributed_to_the_window_they_overlap_and_others_flagged():
    kill = record("kill", "inference-0", 30.0, 50.0, probe=(33.0, 35.0))
    asks = [ask(25, 31, ok=False, code="UNAVAILABLE"),          # in flight at the kill
            ask(40, 41, ok=False, code="UNAVAILABLE"),          # while it was down
            ask(55, 56, ok=False, code="UNAVAILABLE"),          # after it was healthy: a miss
            ask(10, 70.5, ok=False, code="DEADLINE_EXCEEDED"),  # hung through the window
            ask(52, 60, replica="r1"), ask(58, 62, replica="r0")]
    out = summary(asks, [kill])
    row = out["faults"][0]
    assert row["failed"] == 3 and row["hung"] == 1 and row["failed_after_healthy"] == 1
    assert row["in_flight_at_signal"] == 2
    assert (row["probe_start_s"], row["recovery_s"]) == (3.0, 5.0)       # the probe's ask
    assert row["users_recovery_s"] == 22.0 and row["reused_s"] == 28.0
    assert out["totals"]["failures_outside_windows"] == 1 and out["totals"]["hung"] == 1
    assert not out["targets"]["failed_after_healthy"]["met"] and not out["targets"]["hung"]["met"]
    assert out["targets"]["max_recovery_s"]["met"] is True


def test_a_retriever_recovers_only_with_an_ask_that_got_its_chunks():
    stop = record("stop", "crawler", 30.0, 41.0, probe=(50.0, 52.0))
    asks = [ask(31, 33, retrieved=("anns",)), ask(35, 44, retrieved=("anns", "crawler"))]
    row = summary(asks, [stop])["faults"][0]
    assert row["users_recovery_s"] == 5.0 and row["recovery_s"] == 22.0
    assert summary(asks, [stop])["targets"]["max_recovery_s"]["met"] is False    # 20 s > 15 s


def test_an_answer_without_the_asked_retrievers_context_is_degraded():
    both = ask(31, 33, retrieved=("anns",))
    both.spec = AskSpec("q", "both", True)
    out = summary([both, ask(34, 35)], [record("kill", "crawler", 30.0, 40.0, probe=(36.0, 37.0))])
    assert out["faults"][0]["degraded"] == 1 and out["totals"]["degraded"] == 1


def test_a_fault_that_never_recovers_misses_the_recovery_target():
    out = summary([ask(1, 2)], [record("kill", "redis", 30.0, None)])
    assert out["totals"]["max_recovery_s"] is None and not out["targets"]["max_recovery_s"]["met"]


def test_lost_events_and_session_failures_count_against_the_fault_they_fall_near():
    kill = record("kill", "redis", 100.0, 105.0)
    lost = [LostEvents("a", 97.0, {"DONE": 1}), LostEvents("b", 20.0, {"QUEUED": 2})]
    calls = [CallOutcome("ingest", 101, 102, ok=False, code="UNAVAILABLE"), CallOutcome("ingest", 10, 11, ok=True)]
    out = summary([ask(1, 2)], [kill], lost, calls)
    assert out["faults"][0]["lost_events"] == 1 and out["faults"][0]["session_failed"] == 1
    assert out["totals"]["lost_events"] == 3 and not out["targets"]["lost_events"]["met"]


def test_answers_compare_only_where_the_documents_match():
    reference = [ask(0, 1, answer="yes", sources=("d1",))]
    asks = [ask(5, 6, answer="yes", sources=("d1",)), ask(7, 8, answer="no", sources=("d1",)),
            ask(9, 10, answer="maybe", sources=("d2",)), ask(11, 12, ok=False, code="UNAVAILABLE")]
    answers = report.compare_answers(reference, asks)
    assert (answers["compared"], answers["differ"], answers["not_comparable"]) == (2, 1, 1)
    assert answers["examples"][0]["reference"] == ["yes"]


def test_the_results_summary_is_read_by_the_results_page_targets():
    from load_tests.chaos.summary import summarize_runs
    from load_tests.results_summary import Node, targets

    out = summary([ask(31, 33), ask(40, 41, ok=False, code="UNAVAILABLE")],
                  [record("kill", "inference-0", 30.0, 50.0, probe=(31.0, 33.0))])
    data = summarize_runs([out], "streamrag bench chaos", "AMX, 2 cores")
    assert data["chaos"]["runs"][0]["faults"][0]["recovery_s"] == 3.0
    lines = "\n".join(targets(Node(data, "chaos.json")))
    assert "Asks answered under a fault every period" in lines and "**Missed**" in lines


def test_a_failure_overlapping_two_windows_is_charged_to_the_later_fault_only():
    kill, stop = record("kill", "inference-0", 30.0, 100.0), record("stop", "inference-1", 90.0, 101.0)
    out = summary([ask(85, 95, ok=False, code="UNAVAILABLE")], [kill, stop])
    assert [r["failed"] for r in out["faults"]] == [0, 1] and out["totals"]["failures_outside_windows"] == 0
