"""The orchestrator's `Inference` service: prompts without retrieval, for the HTTP gateway.

The gateway's plain chats and completions (`Generate`) and its WebSocket's streamed input
(`StreamPrompt`) come here, not to a replica, so that they are served like every `Ask`:

- the same router picks the replica (`router.choose_ready`, keyed by the prompt's first segment,
  which for a chat is the model's chat head: the prefix every chat shares), waiting a little for
  one when none is available, as an Ask does (failures.py); a `Generate` whose replica fails
  before the first token moves once to another, or, with no other, to the first that is (back)
  within the same wait (the statuses that move, and the wait: failures.py). A
  `StreamPrompt` does not move (the client's input is not kept here): it ends UNAVAILABLE;
- the same store keeps its lifecycle (`recording.py`): created with retriever "none", each engine
  lifecycle event, then FINISHED with the answer, first-token time and the engine's statistics,
  FAILED with the error, or CANCELLED when the caller went away;
- the same metrics count it: `streamrag_asks{mode="plain"}` and the first-token histogram.

The caller may send the text to record as the request's question in the metadata
`protos.metadata.QUESTION_KEY` (UTF-8; the gateway sends the user's last message); without it the
prompt's text is recorded. `Describe` answers for the replica the router would pick now; the
other `Inference` calls are not served here (ask a replica).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

import grpc

from orchestrator.fail_over import fail_over
from orchestrator.failures import ask_fails_over, peer_wait_s, streamed_ask_status
from orchestrator.lifecycle_store import LifecycleStore
from orchestrator.metrics import OrchestratorMetrics
from orchestrator.recording import abort_failed, record_cancelled, record_failed, record_finished, record_lifecycle
from orchestrator.router import NoReplicaAvailable, Replica, ReplicaRouter
from protos import inference_pb2, inference_pb2_grpc
from protos.metadata import QUESTION_KEY

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 2000          # what the record keeps of a question
MODE = "plain"                     # the metrics' mode label
DESCRIBE_TIMEOUT_S = 10.0


def question_of(context: grpc.aio.ServicerContext, segments) -> str:
    """The question to record: the caller's metadata, else the prompt's text."""
    for key, value in context.invocation_metadata() or ():
        if key == QUESTION_KEY:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            return text[:MAX_QUESTION_CHARS]
    return "".join(segment.text for segment in segments)[:MAX_QUESTION_CHARS]


def prefix_key(segments) -> str:
    return segments[0].text if segments else ""


class _Timing:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.first_token: float | None = None

    def ttft(self) -> float:
        return (self.first_token - self.started) if self.first_token is not None else 0.0


class InferenceProxy(inference_pb2_grpc.InferenceServicer):
    def __init__(self, router: ReplicaRouter, store: LifecycleStore, metrics: OrchestratorMetrics) -> None:
        self.router = router
        self.store = store
        self.metrics = metrics

    async def _choose(self, context, key: str) -> Replica:
        """The replica for `key`; with none available, wait a little for one (failures.py)."""
        try:
            return await self.router.choose_ready(key, wait_s=peer_wait_s(context.time_remaining()))
        except NoReplicaAvailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def Describe(self, request, context) -> inference_pb2.DescribeResponse:
        replica = await self._choose(context, "")
        try:
            return await replica.stub.Describe(request, timeout=DESCRIBE_TIMEOUT_S)
        except grpc.RpcError as exc:
            await context.abort(exc.code(), f"replica {replica.address}: {exc.details()}")

    async def _relay(self, request_id: str, event: inference_pb2.InferenceEvent, timing: _Timing,
                     replica: Replica, key: str) -> bool:
        """Record one event of the replica's answer; True for its last (`done`: the answer is complete,
        whether or not the caller reads on)."""
        kind = event.WhichOneof("kind")
        if kind == "lifecycle":
            await record_lifecycle(self.store, request_id, event.lifecycle)
        elif kind == "token" and timing.first_token is None:
            timing.first_token = time.monotonic()
        elif kind == "done":
            self.router.note_served(replica.address, key)
            await record_finished(self.store, request_id, event.done, ttft_from_question_s=timing.ttft(),
                                  total_s=time.monotonic() - timing.started)
            self.metrics.ttft_question.labels(MODE).observe(timing.ttft())
            return True
        return False

    async def Generate(self, request, context) -> AsyncIterator[inference_pb2.GenerateResponse]:
        forward = inference_pb2.GenerateRequest()
        forward.CopyFrom(request)
        forward.request_id = request_id = request.request_id or uuid.uuid4().hex
        key, timing = prefix_key(forward.segments), _Timing()
        replica = await self._choose(context, key)
        await self.store.create(request_id, question_of(context, forward.segments), retriever="none",
                                streamed=False, replica=replica.address)
        outcome, call, retried = "cancelled", None, False
        try:
            while True:
                call = replica.stub.Generate(forward, timeout=context.time_remaining())
                try:
                    async for response in call:
                        if await self._relay(request_id, response.event, timing, replica, key):
                            outcome = "answered"
                        yield response
                    return
                except grpc.RpcError as exc:
                    if retried or timing.first_token is not None or not ask_fails_over(exc.code()):
                        outcome = "failed"       # the replica's status and message, as it gave them
                        await abort_failed(self.store, context, request_id, exc.code(),
                                           exc.details() or exc.code().name)
                    retried = True
                    chosen = await self._fail_over(request_id, replica, key, exc, context.time_remaining())
                    if chosen is None:
                        outcome = "failed"
                        await abort_failed(self.store, context, request_id, grpc.StatusCode.UNAVAILABLE,
                                           f"no replica left after {replica.address}")
                    replica = chosen
        finally:
            if call is not None:
                call.cancel()              # a no-op once it ended; else the replica frees the request's blocks
            if outcome == "cancelled":
                await record_cancelled(self.store, request_id)
            self.metrics.asks.labels(MODE, outcome).inc()

    async def _fail_over(self, request_id: str, replica: Replica, key: str, exc: grpc.RpcError,
                         time_remaining: float | None) -> Replica | None:
        """The replica that takes over from `replica` (fail_over.py); None when none is."""
        try:
            return await fail_over(self.router, self.store, request_id, replica, key, exc, time_remaining)
        except NoReplicaAvailable:
            return None

    async def StreamPrompt(self, request_iterator, context) -> AsyncIterator[inference_pb2.StreamPromptResponse]:
        first = await anext(request_iterator, None)
        if first is None:
            return
        opened = first.update.open if first.update.WhichOneof("kind") == "open" else None
        if opened is not None and not opened.request_id:
            opened.request_id = uuid.uuid4().hex
        request_id = opened.request_id if opened is not None else ""
        key, timing = prefix_key(opened.segments) if opened is not None else "", _Timing()
        replica = await self._choose(context, key)
        if request_id:          # not an open: the replica refuses it, and there is nothing to record
            await self.store.create(request_id, question_of(context, opened.segments), retriever="none",
                                    streamed=True, replica=replica.address)
        call = replica.stub.StreamPrompt(timeout=context.time_remaining())
        pump = asyncio.create_task(self._pump(first, request_iterator, call))
        outcome = "cancelled"
        try:
            async for response in call:
                if request_id and await self._relay(request_id, response.event, timing, replica, key):
                    outcome = "answered"
                yield response
            if not request_id:
                outcome = "answered"
        except grpc.RpcError as exc:
            outcome = "failed"
            code = streamed_ask_status(exc.code())
            if code is grpc.StatusCode.UNAVAILABLE:
                self.router.mark_failed(replica.address)
            message = exc.details() or exc.code().name
            if request_id:
                await record_failed(self.store, request_id, message)
            await context.abort(code, message)
        finally:
            pump.cancel()
            call.cancel()
            if outcome == "cancelled" and request_id:
                await record_cancelled(self.store, request_id)
            self.metrics.asks.labels(MODE, outcome).inc()

    @staticmethod
    async def _pump(first, request_iterator, call) -> None:
        """The caller's prompt messages to the replica, in order, then the end of the input."""
        try:
            await call.write(first)
            async for message in request_iterator:
                await call.write(message)
            await call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass                        # the call failed: the reader reports it
        except Exception as exc:        # e.g. an undecodable message: the replica's call ends with it
            log.warning("StreamPrompt input failed: %s", exc)
            call.cancel()

