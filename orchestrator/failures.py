"""What the orchestrator does when a call to another service fails, and why: one table per kind of call.

The orchestrator reads the gRPC status a failed call ends with and does one of four things
(`Action`). Three kinds of call, three tables:

- `ASK_INFERENCE`: an Ask's inference call (`StreamPrompt`, or `Generate` for the baseline);
- `SESSION_CALL`: a Sessions call forwarded to the replica that holds the session;
- `RETRIEVAL`: an Ask's `Retrieve` on one retriever.

Rules every table shares:
- before the caller has been sent part of an answer (an Ask's or a plain `Generate`'s first
  token, a session query's first response) a retry happens once; after it the answer is kept
  going by a continuation (keeper.py; a session query: session_query.py), up to
  `keeper.MAX_CONTINUATIONS` replicas failing under one answer, and no token is sent twice;
- an inference or session call that ends with a status its table does not name fails the
  request with that same status: the replica judged the request itself (malformed, a prompt
  longer than the model's context, a duplicate id, a full queue), and every replica runs the
  same model, so another would answer the same.

Where the tables differ, they differ on purpose:
- INTERNAL and UNKNOWN fail an Ask over but do not rebuild a session. An Ask's state is the
  prompt the orchestrator holds, so moving it costs one replay: one try elsewhere is cheap
  insurance against a broken replica. A session's state lives on its replica: a rebuild creates
  it again and prefills its whole window on another replica, and the replica that answered is
  alive and still holds this session (and others). So that one call's error goes to the caller.
- DEADLINE_EXCEEDED rebuilds a session but does not fail an Ask over. Every call forwarded to a
  session's replica carries the orchestrator's own deadline (`sessions_servicer.RPC_TIMEOUT_S`):
  when it passes, the replica has stopped answering and is as good as lost. An Ask's inference
  call carries no deadline of the orchestrator's (how long an answer may take is the caller's to
  say, and when the caller's deadline passes the whole Ask is cancelled, not failed), so there
  the status does not mean a replica that stopped answering.

Not by status: `Describe` at the start of an Ask (the replica's chat format, before anything is
sent) fails over once on any error, because a replica that cannot describe itself cannot serve.

Waiting for a service that comes back (`WAIT_FOR_PEER_S`, never past the caller's deadline):
- an Ask that finds no replica available, or whose failed replica leaves no other, waits for
  the first replica whose health says SERVING again (the router's `choose_ready`), the failed
  one included; with none by then, the Ask ends UNAVAILABLE;
- a `Retrieve` that fails UNAVAILABLE before its first chunk is tried once more after the
  retriever's `Describe`, sent with `wait_for_ready`, answers within that time (`RETRIEVAL`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc

from servicekit.channels import RECONNECT_WITHIN_S

S = grpc.StatusCode

# How long a request waits for a replica or retriever to be back. A peer that is up again is
# dialled within the channel's reconnect back-off (RECONNECT_WITHIN_S, 2.4 s) and answers its
# health a moment later: twice that, plus a margin for a loaded machine, covers it, so the
# request right after a restart is served. An Ask in flight when the only replica died waits as
# long for a restart; a replica that takes longer (loading a model) is reported UNAVAILABLE to
# the caller rather than keeping it waiting.
WAIT_FOR_PEER_S = 2 * RECONNECT_WITHIN_S + 3.0


class Action(enum.Enum):
    FAIL_OVER = "mark the replica failed; send the prompt so far to another replica (once)"
    REBUILD = "rebuild the session on another replica from the directory; retry the call (once)"
    FAIL = "fail the request with the same status"
    SKIP_RETRIEVER = "go on without that retriever; the caller gets an ERROR event"
    RETRY_WHEN_READY = ("before its first chunk: wait (up to WAIT_FOR_PEER_S) for the retriever to be ready, "
                        "try once more; skip it if it is not")


@dataclass(frozen=True)
class Rule:
    action: Action
    why: str


# An Ask's inference call, before the first token.
ASK_INFERENCE: dict[grpc.StatusCode, Rule] = {
    S.UNAVAILABLE: Rule(Action.FAIL_OVER, "the replica is down or unreachable, or stopped answering (the channel's "
                                          "keepalive closed the connection); any other serves the same model"),
    S.INTERNAL: Rule(Action.FAIL_OVER, "the replica's engine failed, or the stream broke under it: a fault "
                                       "of that replica, not of the prompt"),
    S.UNKNOWN: Rule(Action.FAIL_OVER, "an exception escaped the replica's handler: a fault of that replica"),
    S.DEADLINE_EXCEEDED: Rule(Action.FAIL, "not a deadline the orchestrator set (it sets none on this call), "
                                           "so not a sign of a stalled replica"),
}
ASK_INFERENCE_OTHERWISE = Rule(Action.FAIL, "the replica refused the request itself; another would too")

# A Sessions call forwarded to the session's replica (a Query only before its first response; a
# Subscribe subscribes again on the new replica whenever it breaks).
SESSION_CALL: dict[grpc.StatusCode, Rule] = {
    S.UNAVAILABLE: Rule(Action.REBUILD, "the replica is down or unreachable: the session went with it"),
    S.DEADLINE_EXCEEDED: Rule(Action.REBUILD, "the orchestrator's own deadline on the call passed: the "
                                              "replica stopped answering"),
    S.NOT_FOUND: Rule(Action.REBUILD, "when the replica says 'no session' for one the directory holds, it "
                                      "restarted; any other NOT_FOUND is about the call and fails it"),
    S.INTERNAL: Rule(Action.FAIL, "the replica is alive and holds the session; a rebuild (the whole window "
                                  "prefilled again) is too dear for one call's error"),
    S.UNKNOWN: Rule(Action.FAIL, "as INTERNAL: one call failed on a replica that still holds the session"),
}
SESSION_CALL_OTHERWISE = Rule(Action.FAIL, "the replica answered about the call itself")
# The replica's answer to a call on a session it does not hold (inference_svc's sessions engine).
NO_SESSION = "no session"

# An Ask's Retrieve on one retriever.
RETRIEVAL: dict[grpc.StatusCode, Rule] = {
    S.NOT_FOUND: Rule(Action.FAIL, "the question names a collection the retriever does not have; an "
                                   "answer without it would hide the mistake"),
    S.INVALID_ARGUMENT: Rule(Action.FAIL, "the retriever refused the question or its options as malformed"),
    S.FAILED_PRECONDITION: Rule(Action.FAIL, "the named collection cannot be searched here (a retriever "
                                             "started without collections)"),
    S.UNAVAILABLE: Rule(Action.RETRY_WHEN_READY, "the retriever is down, or it is back and the channel has not "
                                                 "dialled it again yet (its reconnect back-off): the second try waits "
                                                 "for the channel, so a restarted retriever serves the next Ask"),
}
RETRIEVAL_OTHERWISE = Rule(Action.SKIP_RETRIEVER, "a retriever that is down, slow or broken costs the answer "
                                                  "its context, not the answer: it uses what arrived")


def ask_inference_rule(code: grpc.StatusCode) -> Rule:
    return ASK_INFERENCE.get(code, ASK_INFERENCE_OTHERWISE)


def ask_fails_over(code: grpc.StatusCode) -> bool:
    """Whether an Ask moves to another replica when its inference call ends with `code`."""
    return ask_inference_rule(code).action is Action.FAIL_OVER


def streamed_ask_status(code: grpc.StatusCode) -> grpc.StatusCode:
    """The status a streamed Ask ends with when its inference call failed for good: a replica
    fault (a status that fails over, the one retry spent or a token already sent) is
    UNAVAILABLE to the caller; anything else is passed on. (The baseline passes every status on.)"""
    return S.UNAVAILABLE if ask_fails_over(code) else code


def session_call_rule(code: grpc.StatusCode, details: str | None) -> Rule:
    if code is S.NOT_FOUND and NO_SESSION not in (details or ""):
        return SESSION_CALL_OTHERWISE
    return SESSION_CALL.get(code, SESSION_CALL_OTHERWISE)


def session_needs_rebuild(code: grpc.StatusCode, details: str | None) -> bool:
    return session_call_rule(code, details).action is Action.REBUILD


def replica_lost(code: grpc.StatusCode) -> bool:
    """A session call's replica is gone (not merely restarted): the rebuild marks it failed in the
    router and picks another one."""
    return code in (S.UNAVAILABLE, S.DEADLINE_EXCEEDED)


def retrieval_rule(code: grpc.StatusCode) -> Rule:
    return RETRIEVAL.get(code, RETRIEVAL_OTHERWISE)


def retriever_refused_question(code: grpc.StatusCode) -> bool:
    """Whether a Retrieve ending with `code` fails the Ask (with `code`) instead of being skipped."""
    return retrieval_rule(code).action is Action.FAIL


def retrieval_retries_when_ready(code: grpc.StatusCode, chunks_received: int, retried: bool) -> bool:
    """Whether a Retrieve ending with `code` is tried again once its retriever is ready."""
    return retrieval_rule(code).action is Action.RETRY_WHEN_READY and not chunks_received and not retried


def peer_wait_s(time_remaining: float | None) -> float:
    """How long a request may wait for a replica or retriever to be back: `WAIT_FOR_PEER_S`, never
    past the caller's deadline (`time_remaining`, None without one)."""
    return WAIT_FOR_PEER_S if time_remaining is None else max(0.0, min(WAIT_FOR_PEER_S, time_remaining))
