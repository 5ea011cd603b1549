"""The orchestrator's `Inference` service: prompts without retrieval, for the HTTP gateway.

The gateway's plain chats and completions (`Generate`) and its WebSocket's streamed input
(`StreamPrompt`) come here, not to a replica, so that they are served like every `Ask`:

- the same router picks the replica (`router.choose_ready`, keyed by the prompt's first segment,
  which for a chat is the model's chat head: the prefix every chat shares), waiting a little for
  one when none is available, as an Ask does (failures.py);
- the same keeper (keeper.py) keeps a `Generate`'s answer going: a replica that fails before the
  first token is replaced once (with no other, by the first that is (back) within the same wait),
  one that fails after it is replaced by another that continues the answer (the statuses that
  move, and the wait: failures.py). A caller whose orchestrator died re-issues the call with
  `protos.metadata.RESUME_KEY` and the continuation as its request (gateway/plain_resume.py); the
  keeper continues it, recorded RESUMED (the record's answer is then the text from the re-issue
  on). A `StreamPrompt` does not move (the client's input is not kept here): it ends UNAVAILABLE;
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

from orchestrator.admission import TenantGate
from orchestrator.chat_formats import ChatFormats
from orchestrator.failures import peer_wait_s, streamed_ask_status
from orchestrator.keeper import AnswerFailed, Keeper
from orchestrator.lifecycle_store import LifecycleStore
from orchestrator.metrics import OrchestratorMetrics
from orchestrator.recording import (
    abort_failed,
    record_cancelled,
    record_created,
    record_failed,
    record_finished,
    record_lifecycle,
    record_tenant,
)
from orchestrator.router import NoReplicaAvailable, Replica, ReplicaRouter
from orchestrator.tenancy import current_identity
from protos import common_pb2, inference_pb2, inference_pb2_grpc, orchestrator_pb2
from protos.metadata import QUESTION_KEY, RESUME_KEY
from servicekit.continuation import budget
from servicekit.tenants import Tenants

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


def resume_of(context: grpc.aio.ServicerContext) -> tuple[int, int] | None:
    """A re-issued plain call's (attempt, tokens delivered), from `RESUME_KEY`; None for a first call."""
    for key, value in context.invocation_metadata() or ():
        if key == RESUME_KEY:
            text = value.decode() if isinstance(value, bytes) else str(value)
            attempt, _, tokens = text.partition(":")
            try:
                return int(attempt), int(tokens)
            except ValueError:
                return None
    return None


def continued_prompt(request: inference_pb2.GenerateRequest, tokens: int,
                     ) -> tuple[orchestrator_pb2.AskPrompt, list[int]] | None:
    """A re-issue's request is its continuation (servicekit/continuation.py): the original prompt, then a
    segment of the `tokens` delivered ids, `max_tokens` less them. The original prompt and those ids;
    None when the request is not one."""
    if not tokens:
        return orchestrator_pb2.AskPrompt(segments=request.segments, sampling=request.sampling), []
    last = request.segments[-1] if request.segments else None
    if last is None or last.WhichOneof("content") != "token_ids" or len(last.token_ids.ids) != tokens:
        return None
    sampling = common_pb2.SamplingParams()
    sampling.CopyFrom(request.sampling)
    sampling.max_tokens = budget(request.sampling.max_tokens) + tokens
    return orchestrator_pb2.AskPrompt(segments=request.segments[:-1], sampling=sampling), list(last.token_ids.ids)


class _Timing:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.first_token: float | None = None

    def ttft(self) -> float:
        return (self.first_token - self.started) if self.first_token is not None else 0.0


class InferenceProxy(inference_pb2_grpc.InferenceServicer):
    def __init__(self, router: ReplicaRouter, store: LifecycleStore, metrics: OrchestratorMetrics,
                 gate: TenantGate | None = None) -> None:
        self.router = router
        self.store = store
        self.metrics = metrics
        self.chat_formats = ChatFormats()
        self.gate = gate or TenantGate(Tenants(), None, metrics)    # tenants and their limits (admission.py)

    def _gated(self, context, request_id: str, responses: AsyncIterator, resumed: bool = False) -> AsyncIterator:
        """`responses` (a Generate's or StreamPrompt's) behind the tenant gate (admission.py)."""
        return self.gate.serve(context, request_id, responses, lambda response: response.event, resumed=resumed)

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
                     replica: Replica, key: str, record_lifecycles: bool = True) -> bool:
        """Record one event of the replica's answer (lifecycle events: when `record_lifecycle`); True for
        its last (`done`: the answer is complete, whether or not the caller reads on)."""
        kind = event.WhichOneof("kind")
        if kind == "lifecycle" and record_lifecycles:
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
        if not request.request_id:            # named here, so that the gate records the tenant under it
            request.request_id = uuid.uuid4().hex
        async for response in self._gated(context, request.request_id, self._generate(request, context),
                                          resumed=resume_of(context) is not None):
            yield response

    async def _generate(self, request, context) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """The answer, kept going by a keeper (keeper.py) like an Ask's: moved once before its first
        token, continued on another replica after it; a re-issue (`RESUME_KEY`) continues it."""
        request_id = request.request_id or uuid.uuid4().hex
        key, timing, resume = prefix_key(request.segments), _Timing(), resume_of(context)
        out: asyncio.Queue = asyncio.Queue()
        keeper = Keeper(request_id, self.router, self.store, out.put, key=key, chat_formats=self.chat_formats,
                        time_remaining=context.time_remaining, attempt=resume[0] if resume else 0)
        keeper.failure_prefix = ""                 # the replica's status and message, as it gave them
        continued = continued_prompt(request, resume[1] if resume else 0)
        if continued is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{RESUME_KEY} names {resume[1]} tokens: the "
                                "request's last segment must be those token ids (its continuation)")
        resumed = bool(resume and resume[1])
        if not resumed:
            try:            # with no replica there is nothing to record: the call ends UNAVAILABLE
                await keeper.choose()
            except NoReplicaAvailable as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        outcome, task = "cancelled", None
        try:
            if resumed:
                try:
                    await keeper.resumed(continued[1], "", prompt=continued[0])
                except NoReplicaAvailable as exc:
                    raise AnswerFailed(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
                work = keeper.continue_answer()
            else:
                await record_created(self.store, request_id, question_of(context, request.segments),
                                     retriever="none", streamed=False, replica=keeper.replica.address)
                if resume:
                    await keeper.retried()
                keeper.prompt = continued[0]      # kept here: the caller holds the prompt to re-issue
                forward = inference_pb2.GenerateRequest()
                forward.CopyFrom(request)
                forward.request_id = keeper.inference_id
                work = keeper.generate(forward)
            task = asyncio.create_task(_guarded(work, out))
            while True:
                item = await out.get()
                if isinstance(item, BaseException):
                    raise item
                if await self._relay(request_id, item, timing, keeper.replica, key, record_lifecycles=False):
                    outcome = "answered"           # counted with its record, before the caller reads on
                    self.metrics.asks.labels(MODE, outcome).inc()
                yield inference_pb2.GenerateResponse(event=item)
                if outcome == "answered":
                    return
        except AnswerFailed as failure:
            outcome = "failed"
            await abort_failed(self.store, context, request_id, failure.code, failure.message)
        finally:
            if task is not None:
                task.cancel()              # its call too: the replica frees the request's blocks
                await asyncio.gather(task, return_exceptions=True)
            if outcome != "answered":
                self.metrics.asks.labels(MODE, outcome).inc()
            await keeper.close()
            if outcome == "cancelled":
                await record_cancelled(self.store, request_id)

    async def StreamPrompt(self, request_iterator, context) -> AsyncIterator[inference_pb2.StreamPromptResponse]:
        async for response in self._gated(context, "", self._stream_prompt(request_iterator, context)):
            yield response

    async def _stream_prompt(self, request_iterator, context) -> AsyncIterator[inference_pb2.StreamPromptResponse]:
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
            await record_created(self.store, request_id, question_of(context, opened.segments), retriever="none",
                                 streamed=True, replica=replica.address)
            identity = current_identity.get()
            if identity is not None:
                await record_tenant(self.store, request_id, identity.tenant.name, identity.priority)
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



async def _guarded(work, out: asyncio.Queue) -> None:
    """Run the keeper's `work`; what it raises ends the call (read from `out`)."""
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        await out.put(exc)
