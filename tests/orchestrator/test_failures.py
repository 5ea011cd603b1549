"""The orchestrator's failure table (orchestrator/failures.py), status by status: what an Ask does
when its inference call or a retriever fails, and what a forwarded Sessions call does."""

from __future__ import annotations

import grpc
import pytest

from orchestrator.failures import (
    ASK_INFERENCE,
    RETRIEVAL,
    SESSION_CALL,
    WAIT_FOR_PEER_S,
    Action,
    ask_fails_over,
    ask_inference_rule,
    peer_wait_s,
    replica_lost,
    retrieval_retries_when_ready,
    retrieval_rule,
    retriever_refused_question,
    session_call_rule,
    session_needs_rebuild,
    streamed_ask_status,
)

S = grpc.StatusCode
EVERY_STATUS = list(grpc.StatusCode)
ASK_FAILS_OVER_ON = {S.UNAVAILABLE, S.INTERNAL, S.UNKNOWN}
SESSION_REBUILDS_ON = {S.UNAVAILABLE, S.DEADLINE_EXCEEDED}          # and NOT_FOUND "no session ..."
ASK_FAILS_ON_RETRIEVER = {S.NOT_FOUND, S.INVALID_ARGUMENT, S.FAILED_PRECONDITION}
RETRIEVAL_RETRIED_ON = {S.UNAVAILABLE}


@pytest.mark.parametrize("code", EVERY_STATUS, ids=lambda code: code.name)
def test_an_ask_fails_over_on_a_broken_replica_and_fails_with_any_other_status(code):
    assert ask_fails_over(code) is (code in ASK_FAILS_OVER_ON)
    assert ask_inference_rule(code).action is (Action.FAIL_OVER if code in ASK_FAILS_OVER_ON else Action.FAIL)


@pytest.mark.parametrize("code", EVERY_STATUS, ids=lambda code: code.name)
def test_a_streamed_ask_that_cannot_fail_over_any_more_says_unavailable_for_a_replica_fault(code):
    assert streamed_ask_status(code) is (S.UNAVAILABLE if code in ASK_FAILS_OVER_ON else code)


@pytest.mark.parametrize("code", EVERY_STATUS, ids=lambda code: code.name)
def test_a_session_is_rebuilt_when_its_replica_is_lost(code):
    details = "replica gone"
    assert session_needs_rebuild(code, details) is (code in SESSION_REBUILDS_ON)
    assert replica_lost(code) is (code in SESSION_REBUILDS_ON)


def test_a_session_is_rebuilt_on_a_replica_that_forgot_it_and_not_for_other_not_found():
    assert session_needs_rebuild(S.NOT_FOUND, "no session 'abc'")
    assert session_call_rule(S.NOT_FOUND, "no session 'abc'").action is Action.REBUILD
    assert not replica_lost(S.NOT_FOUND)          # it restarted: it stays in the router's choice
    for details in ("no flash question 'q'", "", None):
        assert not session_needs_rebuild(S.NOT_FOUND, details)


def test_an_ask_and_a_session_differ_on_internal_and_deadline_exceeded():
    """The two rules differ on purpose (failures.py says why): an Ask's state is a cheap replay,
    a session's is its replica's; only the session calls carry the orchestrator's own deadline."""
    for code in (S.INTERNAL, S.UNKNOWN):
        assert ask_fails_over(code) and not session_needs_rebuild(code, "engine error")
    assert not ask_fails_over(S.DEADLINE_EXCEEDED) and session_needs_rebuild(S.DEADLINE_EXCEEDED, "")


@pytest.mark.parametrize("code", EVERY_STATUS, ids=lambda code: code.name)
def test_a_retriever_refusing_the_question_fails_the_ask_and_any_other_failure_is_skipped(code):
    assert retriever_refused_question(code) is (code in ASK_FAILS_ON_RETRIEVER)
    expected = (Action.FAIL if code in ASK_FAILS_ON_RETRIEVER else
                Action.RETRY_WHEN_READY if code in RETRIEVAL_RETRIED_ON else Action.SKIP_RETRIEVER)
    assert retrieval_rule(code).action is expected


@pytest.mark.parametrize("code", EVERY_STATUS, ids=lambda code: code.name)
def test_a_retriever_that_is_down_is_tried_once_more_only_before_its_first_chunk(code):
    retried = code in RETRIEVAL_RETRIED_ON
    assert retrieval_retries_when_ready(code, chunks_received=0, retried=False) is retried
    assert not retrieval_retries_when_ready(code, chunks_received=1, retried=False)   # no chunk sent twice
    assert not retrieval_retries_when_ready(code, chunks_received=0, retried=True)    # once


def test_the_wait_for_a_peer_never_outlasts_the_callers_deadline():
    assert peer_wait_s(None) == WAIT_FOR_PEER_S
    assert peer_wait_s(WAIT_FOR_PEER_S * 10) == WAIT_FOR_PEER_S
    assert peer_wait_s(1.5) == 1.5
    assert peer_wait_s(-3.0) == 0.0


def test_every_rule_says_why():
    for table in (ASK_INFERENCE, SESSION_CALL, RETRIEVAL):
        for code, rule in table.items():
            assert rule.why.strip(), code
    for rule in (ask_inference_rule(S.ABORTED), session_call_rule(S.ABORTED, ""), retrieval_rule(S.ABORTED)):
        assert rule.why.strip()
