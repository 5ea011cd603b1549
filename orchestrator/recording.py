"""What the orchestrator records of an inference call, the same for every request that reaches a
replica through it: each engine lifecycle event under its kind's short name ("QUEUED",
"SCHEDULED", ...), and at the end the FINISHED record (answer, first-token time, finish reason,
the engine's statistics) with a `DONE` event. The store (`lifecycle_store.py`) keeps what it is
given; these are the rules of what to give it.
"""

from __future__ import annotations

from orchestrator.lifecycle_store import LifecycleStore, lifecycle_kind_name
from protos import common_pb2, inference_pb2


async def record_lifecycle(store: LifecycleStore, request_id: str, lifecycle: common_pb2.LifecycleEvent) -> None:
    await store.event(request_id, lifecycle_kind_name(lifecycle.kind), detail=lifecycle.detail, count=lifecycle.count)


async def record_finished(store: LifecycleStore, request_id: str, done: inference_pb2.InferenceDone, *,
                          ttft_from_question_s: float, total_s: float, **times_s: float) -> None:
    """The answer is complete: the FINISHED record and its `DONE` event (`times_s`: more timings in
    seconds, such as an Ask's `ttft_from_retrieval_end_s`, kept in both)."""
    await store.update(request_id, state="FINISHED", answer=done.text, ttft_from_question_s=ttft_from_question_s,
                       finish_reason=common_pb2.FinishReason.Name(done.finish_reason), stats=done.stats, **times_s)
    await store.event(request_id, "DONE", ttft_from_question_s=round(ttft_from_question_s, 4),
                      **{name: round(value, 4) for name, value in times_s.items()}, total_s=round(total_s, 4))


async def record_failed(store: LifecycleStore, request_id: str, message: str) -> None:
    await store.event(request_id, "ERROR", detail=message)
    await store.update(request_id, state="FAILED", error=message)


async def record_cancelled(store: LifecycleStore, request_id: str) -> None:
    """The caller went away before the answer was complete (its KV blocks are freed by the cancel)."""
    await store.event(request_id, "CANCELLED")
    await store.update(request_id, state="CANCELLED")
