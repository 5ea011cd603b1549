"""One `Ask`, end to end: retrieve, relay, prefill as context arrives, stream the answer.

Streaming on: open `StreamPrompt` with the head (instructions + question) at once, relay
every retrieved chunk as it arrives (`append` / `update` on the merged document list),
`finish` with the suffix when retrieval ends or its deadline passes. Streaming off (the
baseline): wait for retrieval to end, then one `Generate` with the very same segments.

Three tasks feed one output queue that `run()` drains: the retrievers (one task each), the
relay (retrieval → inference), and the inference reader (inference → caller). A retriever
that fails or stalls only ends its own contribution; an inference replica that fails before
the first token is replaced once by another replica, which is sent the prompt so far (which
statuses do what, and why: failures.py; the move: fail_over.py). Once the prompt is complete it
is saved in the lifecycle store; a replica that fails after the first token is replaced too, and
the new one continues from the prompt plus the tokens delivered (resume.py), as does any
orchestrator that the caller re-issues the Ask to (`AskRequest.resume`) when this one died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from orchestrator.context_warnings import ContextWarnings
from orchestrator.documents import MergedDocuments
from orchestrator.fail_over import fail_over
from orchestrator.failures import (
    ask_fails_over,
    peer_wait_s,
    retrieval_retries_when_ready,
    retriever_refused_question,
    streamed_ask_status,
)
from orchestrator.lifecycle_store import StoreUnavailable
from orchestrator.pairing import Pair, choose_pair
from orchestrator.prompt import document_segment, head_segments, preamble_key, suffix_segments
from orchestrator.recording import record_error, record_finished, record_lifecycle
from orchestrator.resume import (
    MAX_RESUMES,
    PROMPT_FLUSH_S,
    continuation,
    length_done,
    load_prompt,
    save_prompt,
    whole_answer,
)
from orchestrator.router import NoReplicaAvailable
from protos import common_pb2, inference_pb2, orchestrator_pb2, retriever_pb2, retriever_pb2_grpc

log = logging.getLogger(__name__)

RETRIEVER_NAMES = {
    orchestrator_pb2.RETRIEVER_CHOICE_ANNS: ["anns"],
    orchestrator_pb2.RETRIEVER_CHOICE_CRAWLER: ["crawler"],
    orchestrator_pb2.RETRIEVER_CHOICE_BOTH: ["anns", "crawler"],
    orchestrator_pb2.RETRIEVER_CHOICE_NONE: [],
    orchestrator_pb2.RETRIEVER_CHOICE_REPLAY: ["replay"],
}
DEFAULT_TOP_K = 5
DEFAULT_DEADLINE_MS = 20_000
DEFAULT_MAX_TOKENS = 128
MAX_QUESTION_CHARS = 2000


class BadAsk(ValueError):
    pass


@dataclass(frozen=True)
class AskSettings:
    request_id: str
    question: str
    choice: int                       # orchestrator_pb2.RETRIEVER_CHOICE_*
    retrievers: list[str]
    streamed: bool
    top_k: int
    deadline_s: float
    sampling: common_pb2.SamplingParams
    retriever_options: dict[str, str]
    collection: str = ""              # the ANNS collection ("" = the retriever's default)
    resume: orchestrator_pb2.AskResume | None = None   # a re-issued Ask: what the caller already has
    requested: int = 0                # the retriever choice as asked (0: left to the default)


def validate_ask(request: orchestrator_pb2.AskRequest, available: set[str]) -> AskSettings:
    question = request.question.strip()
    if not question:
        raise BadAsk("question must not be empty")
    if len(request.question) > MAX_QUESTION_CHARS:
        raise BadAsk(f"question is {len(request.question)} characters; the limit is {MAX_QUESTION_CHARS}")
    choice = request.retriever or orchestrator_pb2.RETRIEVER_CHOICE_ANNS
    if choice not in RETRIEVER_NAMES:
        raise BadAsk(f"unknown retriever choice {request.retriever}")
    retrievers = RETRIEVER_NAMES[choice]
    missing = [name for name in retrievers if name not in available]
    if missing:
        raise BadAsk(f"retriever {', '.join(missing)} is not configured on this orchestrator")
    max_tokens = request.max_tokens or request.sampling.max_tokens or DEFAULT_MAX_TOKENS
    if not 1 <= max_tokens <= 4096:
        raise BadAsk(f"max_tokens must be in [1, 4096], got {max_tokens}")
    top_k = request.top_k or DEFAULT_TOP_K
    if not 1 <= top_k <= 50:
        raise BadAsk(f"top_k must be in [1, 50], got {request.top_k}")
    deadline_ms = request.retrieval_deadline_ms or DEFAULT_DEADLINE_MS
    if not 1 <= deadline_ms <= 600_000:
        raise BadAsk(f"retrieval_deadline_ms must be in [1, 600000], got {request.retrieval_deadline_ms}")
    sampling = common_pb2.SamplingParams()
    sampling.CopyFrom(request.sampling)
    sampling.max_tokens = max_tokens
    request_id = request.request_id or uuid.uuid4().hex
    if len(request_id) > 128 or not request_id.isprintable():
        raise BadAsk("request_id must be printable and at most 128 characters")
    if request.collection and "anns" not in retrievers:
        raise BadAsk(f"collection {request.collection!r} applies to the anns retriever; ask with it (or both)")
    resume = request.resume if request.HasField("resume") else None
    if resume is not None:
        if not request.request_id:
            raise BadAsk("resume needs the request_id of the Ask it resumes")
        if resume.attempt < 0:
            raise BadAsk(f"resume.attempt must be >= 0, got {resume.attempt}")
        if len(resume.token_ids) > max_tokens:
            raise BadAsk(f"resume has {len(resume.token_ids)} tokens, more than max_tokens {max_tokens}")
    return AskSettings(request_id, question, choice, retrievers, not request.no_stream, top_k, deadline_ms / 1000,
                       sampling, dict(request.retriever_options), request.collection, resume,
                       requested=request.retriever)


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    retrieval_end: float | None = None
    first_token: float | None = None


class InferenceSession:
    """The StreamPrompt call to one replica, and everything sent so far (to replay on a retry).

    A write to a call that has failed is not an error here: the reader sees the failure and
    either moves the session to another replica (replaying every message, this one included)
    or reports it. A lock keeps a replay and new writes in order.
    """

    def __init__(self, stub, request_id: str, sampling: common_pb2.SamplingParams, metadata=()) -> None:
        self.request_id = request_id
        self.sampling = sampling
        self.sent: list[inference_pb2.StreamPromptRequest] = []
        self.closed = False                      # done_writing was called
        self.call = stub.StreamPrompt(metadata=metadata)   # a decode replica to hand off to (pairing.py)
        self._lock = asyncio.Lock()

    async def send(self, update: inference_pb2.PromptUpdate) -> None:
        message = inference_pb2.StreamPromptRequest(update=update)
        async with self._lock:
            self.sent.append(message)
            await self._write(message)

    async def close(self) -> None:
        async with self._lock:
            self.closed = True
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self.call.done_writing()

    async def _write(self, message: inference_pb2.StreamPromptRequest) -> None:
        try:
            await self.call.write(message)
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            log.debug("%s: write to a failed call (%s); the reader decides", self.request_id, exc)

    async def reopen(self, stub) -> None:
        """Move to another replica and send it the whole prompt so far."""
        async with self._lock:
            self.call.cancel()
            self.call = stub.StreamPrompt()
            for message in self.sent:
                await self._write(message)
            if self.closed:
                with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                    await self.call.done_writing()


class AskPipeline:
    def __init__(self, settings: AskSettings, router, retriever_stubs: dict[str, retriever_pb2_grpc.RetrieverStub],
                 store, chat_formats, time_remaining: Callable[[], float | None] = lambda: None) -> None:
        self.s = settings
        self.router = router
        self.retriever_stubs = retriever_stubs
        self.store = store
        self.chat_formats = chat_formats      # async (replica) -> ChatFormat (Describe, cached)
        self.time_remaining = time_remaining  # the caller's deadline: seconds left, None without one
        # With both retrievers, crawler pages are placed by relevance (orchestrator/documents.py).
        self.docs = MergedDocuments(by_relevance=settings.choice == orchestrator_pb2.RETRIEVER_CHOICE_BOTH)
        self.timeline = Timeline()
        self.out: asyncio.Queue = asyncio.Queue()
        self.answer = ""
        self.replica = None
        self.session: InferenceSession | None = None
        self.tasks: list[asyncio.Task] = []
        self.warnings = ContextWarnings(settings.request_id, store, self.out)   # context_warnings.py
        self.delivered_ids: list[int] = []          # the answer's token ids sent to the caller
        self.prompt: orchestrator_pb2.AskPrompt | None = None   # once complete (saved in the store)
        self.prompt_stored: asyncio.Task | None = None          # the store's flush after saving it
        self.continuing = False                     # decoding a continuation (resume.py)
        self.before_text, self.before_tokens = "", 0   # what the continuation continues from
        self.resumes = 0
        self.broke_at: float | None = None          # monotonic: the break a continuation resumes from
        self.continued_first_token_s: float | None = None   # the break to the continuation's first token
        # A retry may land on a replica that still holds the broken request: a new inference id.
        retry = settings.resume.attempt if settings.resume is not None else 0
        self.inference_id = f"{settings.request_id}@retry-{retry}" if retry else settings.request_id

    @property
    def resuming(self) -> bool:
        """A re-issued Ask whose caller already has tokens: the answer continues (resume.py)."""
        return self.s.resume is not None and len(self.s.resume.token_ids) > 0

    # --- the caller's view ------------------------------------------------------------
    async def run(self) -> AsyncIterator[orchestrator_pb2.AskEvent]:
        s = self.s
        if self.resuming:
            await self._start_resumed()
        else:
            chat = await self._choose_replica()
            await self.store.create(s.request_id, s.question, retriever=",".join(s.retrievers) or "none",
                                    streamed=s.streamed, replica=self.replica.address)
            s = self.s = await self.warnings.plan(s, self.retriever_stubs)
            if s.resume is not None:
                await self.store.event(s.request_id, "RETRIED", attempt=s.resume.attempt, tokens=0)
        yield orchestrator_pb2.AskEvent(started=orchestrator_pb2.AskStarted(
            request_id=s.request_id, replica=self.replica.address, retriever=s.choice, streamed=s.streamed))
        retrieval: asyncio.Queue = asyncio.Queue()
        try:
            if self.resuming:
                self.tasks.append(asyncio.create_task(self._continue_answer()))
            for name in [] if self.resuming else s.retrievers:
                self.tasks.append(asyncio.create_task(self._retrieve(name, retrieval)))
            if self.resuming:
                pass
            elif s.streamed:
                self.tasks.append(asyncio.create_task(self._relay_streaming(chat, retrieval)))
            else:
                self.tasks.append(asyncio.create_task(self._relay_baseline(chat, retrieval)))
            while True:
                item = await self.out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.WhichOneof("kind") == "done":
                    return
        finally:   # done, failed or the caller went away: stop everything upstream
            if self.session is not None:
                self.session.call.cancel()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _choose_replica(self):
        """Pick a replica (waiting a little for one when none is available: failures.py) and read its
        chat format; a replica that fails here is replaced once."""
        self.replica = await self.router.choose_ready(preamble_key(), wait_s=peer_wait_s(self.time_remaining()))
        self.pair = choose_pair(self.router, preamble_key(), self.replica) if self.s.streamed else Pair(self.replica)
        self.replica = self.pair.prefill
        try:
            return await self.chat_formats(self.replica)
        except grpc.RpcError as exc:      # any failure to describe itself: the replica is unusable (failures.py)
            await self._fail_over(exc, record=False)     # the request is not in the store yet
            return await self.chat_formats(self.replica)

    async def _fail_over(self, exc: grpc.RpcError, record: bool = True, resumed_tokens: int | None = None) -> None:
        """Move to another replica (fail_over.py). Raises `AskFailed(UNAVAILABLE)` when none is left.
        Before the first token callers allow it once (`_may_fail_over`; which statuses fail over,
        and why: failures.py); after it, `_continue_answer` allows MAX_RESUMES continuations."""
        failed = self.replica.address
        try:
            self.replica = await fail_over(self.router, self.store if record else None, self.s.request_id,
                                           self.replica, preamble_key(), exc, self.time_remaining(),
                                           resumed_tokens=resumed_tokens)
        except NoReplicaAvailable as none:
            raise AskFailed(grpc.StatusCode.UNAVAILABLE, f"no replica left after {failed} failed "
                            f"({exc.code().name}): {none}") from exc

    def _may_fail_over(self, exc: grpc.RpcError, retried: bool) -> bool:
        return ask_fails_over(exc.code()) and not retried and self.timeline.first_token is None

    # --- continuing an answer (resume.py) ------------------------------------------------------
    async def _start_resumed(self) -> None:
        """A re-issued Ask with tokens: the prompt the store recorded, a replica, the record updated."""
        s, tokens = self.s, len(self.s.resume.token_ids)
        try:
            self.prompt = await load_prompt(self.store, s.request_id)
        except StoreUnavailable as exc:
            raise AskFailed(grpc.StatusCode.UNAVAILABLE, f"request {s.request_id!r} cannot be resumed while "
                            f"the lifecycle store is unavailable: {exc}") from exc
        if self.prompt is None:
            raise AskFailed(grpc.StatusCode.NOT_FOUND, f"no complete prompt is recorded for request "
                            f"{s.request_id!r}: it cannot continue after {tokens} tokens")
        if len(s.resume.token_ids) > self.prompt.sampling.max_tokens:
            raise AskFailed(grpc.StatusCode.INVALID_ARGUMENT, f"resume has {tokens} tokens; request "
                            f"{s.request_id!r} allows {self.prompt.sampling.max_tokens}")
        self.delivered_ids, self.answer = list(s.resume.token_ids), s.resume.text
        self.timeline.first_token = self.timeline.started    # the answer started before this Ask
        self.broke_at = self.timeline.started                # the caller saw the break before it re-issued
        self.replica = await self.router.choose_ready(preamble_key(), wait_s=peer_wait_s(self.time_remaining()))
        log.info("%s: resuming after %d tokens on %s (attempt %d)", s.request_id, tokens, self.replica.address,
                 s.resume.attempt)
        await self.store.event(s.request_id, "RESUMED", attempt=s.resume.attempt, tokens=tokens,
                               replica=self.replica.address)
        await self.store.update(s.request_id, state="GENERATING", replica=self.replica.address)

    async def _save_prompt(self, segments: list[common_pb2.Segment]) -> None:
        """The prompt is complete: keep it (and its sources) in the store, for any orchestrator to
        continue from; the first token waits for it to be stored (`_on_inference_event`)."""
        end = self.timeline.retrieval_end or self.timeline.started
        self.prompt = orchestrator_pb2.AskPrompt(
            segments=segments, sampling=self.s.sampling, retrieval_s=end - self.timeline.started,
            sources=[common_pb2.Document(id=d.id, title=d.title, url=d.url, score=d.score, source=d.source)
                     for d in self.docs.all])
        await save_prompt(self.store, self.s.request_id, self.prompt)
        if self.store.available:      # with Redis down the answer goes on (the store buffers the write)
            self.prompt_stored = asyncio.create_task(self.store.flush(PROMPT_FLUSH_S))
            self.tasks.append(self.prompt_stored)

    async def _continue_answer(self, exc: grpc.RpcError | None = None) -> None:
        """Decode the rest of the answer from the prompt plus the tokens delivered (resume.py), on the
        current replica or, after `exc`, on another one; up to MAX_RESUMES replicas fail under it."""
        while True:
            if exc is not None:
                self.broke_at = time.monotonic()
                if self.resumes >= MAX_RESUMES or not ask_fails_over(exc.code()) or self.prompt is None:
                    await self.out.put(AskFailed(streamed_ask_status(exc.code()), f"inference failed: {exc.details()}"))
                    return
                self.resumes += 1
                try:
                    await self._fail_over(exc, resumed_tokens=len(self.delivered_ids))
                except AskFailed as failure:
                    await self.out.put(failure)
                    return
            self.continuing, self.before_text, self.before_tokens = True, self.answer, len(self.delivered_ids)
            self.continued_first_token_s = None
            request = continuation(self.prompt, self.delivered_ids, self.s.request_id)
            if request is None:
                await self._record_continued(None)
                await self.out.put(await self._done(length_done(self.answer, len(self.delivered_ids))))
                return
            try:
                async for response in self.replica.stub.Generate(request):
                    await self._on_inference_event(response.event)
                return
            except grpc.RpcError as again:
                exc = again

    async def _record_continued(self, stats: common_pb2.RequestStats | None) -> None:
        """A continuation finished: a CONTINUED event with what it cost, from the tokens it continued after
        (`tokens`), the KV its replica computed again for them (`tokens_computed`: the prompt plus those
        tokens, less `prefix_cache_hit_tokens`) and the time from the break to its first token
        (`first_token_s`; absent when no token was left to decode)."""
        fields = {"tokens": self.before_tokens, "replica": self.replica.address}
        if stats is not None:
            fields |= {"prompt_tokens": stats.prompt_tokens, "tokens_computed": stats.tokens_computed,
                       "prefix_cache_hit_tokens": stats.prefix_cache_hit_tokens}
        if self.continued_first_token_s is not None:
            fields["first_token_s"] = round(self.continued_first_token_s, 4)
        await self.store.event(self.s.request_id, "CONTINUED", **fields)

    # --- retrieval ----------------------------------------------------------------------
    async def _retrieve(self, name: str, retrieval: asyncio.Queue) -> None:
        request = retriever_pb2.RetrieveRequest(query=self.s.question, top_k=self.s.top_k,
                                                deadline_ms=int(self.s.deadline_s * 1000),
                                                options=self.s.retriever_options, request_id=self.s.request_id,
                                                collection=self.s.collection if name == "anns" else "")
        stub = self.retriever_stubs[name]
        received = 0
        retried = False
        try:
            while True:
                try:
                    async for response in stub.Retrieve(request, timeout=self.s.deadline_s + 5):
                        received += 1
                        await retrieval.put((name, response.chunk))
                        if response.chunk.final:
                            break
                    break
                except grpc.RpcError as exc:
                    if not retrieval_retries_when_ready(exc.code(), received, retried):
                        raise
                    retried = True
                    if not await self._retriever_ready(name, stub):
                        raise
        except asyncio.CancelledError:
            raise
        except grpc.RpcError as exc:
            if retriever_refused_question(exc.code()):   # e.g. a bad collection: no answer without it
                await self.out.put(AskFailed(exc.code(), f"retriever {name}: {exc.details()}"))
                return
            await self._retrieval_failed(name, exc.details())
        except Exception as exc:
            await self._retrieval_failed(name, str(exc))
        finally:
            await retrieval.put((name, None))   # this retriever is done

    async def _retriever_ready(self, name: str, stub) -> bool:
        """Whether the retriever answers `Describe`, sent with `wait_for_ready`, within the wait
        (failures.py), never past the retrieval deadline: the channel dials it as soon as its
        back-off allows."""
        left = self.timeline.started + self.s.deadline_s - time.monotonic()
        wait_s = min(peer_wait_s(self.time_remaining()), left)
        if wait_s <= 0:
            return False
        try:
            await stub.Describe(retriever_pb2.RetrieverDescribeRequest(), timeout=wait_s, wait_for_ready=True)
        except grpc.RpcError as exc:
            log.info("%s: retriever %s not back within %.1f s (%s)", self.s.request_id, name, wait_s,
                     exc.code().name)
            return False
        log.info("%s: retriever %s is back: retrieving again", self.s.request_id, name)
        return True

    async def _retrieval_failed(self, name: str, detail: str) -> None:
        """Go on with what arrived; the error is recorded and reported to the caller."""
        log.warning("%s: retriever %s failed: %s", self.s.request_id, name, detail)
        await record_error(self.store, self.s.request_id, detail, source=name)
        await self.out.put(_lifecycle(common_pb2.LIFECYCLE_EVENT_KIND_ERROR, f"retriever {name}: {detail}"))
        await self.warnings.retriever_failed(name, detail)

    async def _retrieved(self, retrieval: asyncio.Queue):
        """Yield (source, chunk) until every retriever is done or the deadline passes."""
        pending = set(self.s.retrievers)
        deadline = self.timeline.started + self.s.deadline_s
        while pending:
            try:
                name, chunk = await asyncio.wait_for(retrieval.get(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                await record_error(self.store, self.s.request_id, "retrieval deadline passed")
                await self.warnings.deadline_passed(self.s.deadline_s, pending)
                break
            if chunk is None:
                pending.discard(name)
                continue
            yield name, chunk
        await self.warnings.retrieval_ended(self.s.retrievers, len(self.docs.all))
        self.timeline.retrieval_end = time.monotonic()

    async def _note_chunk(self, name: str, chunk: retriever_pb2.ContextChunk) -> None:
        await self.store.event(self.s.request_id, "RETRIEVAL_CHUNK", source=name, seq=chunk.seq,
                               mode=retriever_pb2.ChunkMode.Name(chunk.mode), docs=len(chunk.documents),
                               final=chunk.final)
        await self.out.put(orchestrator_pb2.AskEvent(retrieval=orchestrator_pb2.RetrievalProgress(
            seq=chunk.seq, mode=chunk.mode, num_documents=len(self.docs.all), final=chunk.final, source=name,
            elapsed_s=time.monotonic() - self.timeline.started,
            documents=[common_pb2.Document(id=d.id, title=d.title, url=d.url, score=d.score, source=name)
                       for d in chunk.documents])))

    # --- streaming relay ----------------------------------------------------------------
    async def _relay_streaming(self, chat, retrieval: asyncio.Queue) -> None:
        try:
            session = self.session = InferenceSession(self.replica.stub, self.s.request_id, self.s.sampling,
                                                      self.pair.metadata if self.pair.prefill is self.replica else ())
            reader = asyncio.create_task(self._read_inference(session, chat))
            self.tasks.append(reader)
            await session.send(inference_pb2.PromptUpdate(open=inference_pb2.PromptOpen(
                request_id=self.inference_id, sampling=self.s.sampling,
                segments=head_segments(chat, self.s.question))))
            async for name, chunk in self._retrieved(retrieval):
                action, docs = self.docs.apply(chunk)
                await self._note_chunk(name, chunk)
                if action == "append":
                    await session.send(inference_pb2.PromptUpdate(append=inference_pb2.PromptAppend(
                        segments=[document_segment(d) for d in docs])))
                elif action == "update":
                    await session.send(inference_pb2.PromptUpdate(update=inference_pb2.PromptReplace(
                        segments=[document_segment(d) for d in docs], final_stage=chunk.final)))
            await self._save_prompt(head_segments(chat, self.s.question) + [document_segment(d) for d in self.docs.all]
                                    + suffix_segments(chat, self.s.question))
            await session.send(inference_pb2.PromptUpdate(finish=inference_pb2.PromptFinish(
                segments=suffix_segments(chat, self.s.question))))
            await session.close()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.out.put(exc)

    async def _read_inference(self, session: InferenceSession, chat) -> None:
        retried = False
        while True:
            try:
                async for response in session.call:
                    await self._on_inference_event(response.event)
                return
            except asyncio.CancelledError:
                raise
            except grpc.RpcError as exc:
                if self.timeline.first_token is not None:
                    await self._continue_answer(exc)
                    return
                if not self._may_fail_over(exc, retried):
                    await self.out.put(AskFailed(streamed_ask_status(exc.code()),
                                                 f"inference failed: {exc.details()}"))
                    return
                retried = True
                try:
                    await self._fail_over(exc)
                except AskFailed as failure:
                    await self.out.put(failure)
                    return
                await session.reopen(self.replica.stub)

    # --- non-streaming baseline ---------------------------------------------------------
    async def _relay_baseline(self, chat, retrieval: asyncio.Queue) -> None:
        try:
            async for name, chunk in self._retrieved(retrieval):
                self.docs.apply(chunk)
                await self._note_chunk(name, chunk)
            segments = (head_segments(chat, self.s.question) + [document_segment(d) for d in self.docs.all]
                        + suffix_segments(chat, self.s.question))
            request = inference_pb2.GenerateRequest(request_id=self.inference_id, segments=segments,
                                                    sampling=self.s.sampling)
            await self._save_prompt(segments)
            retried = False
            while True:
                try:
                    async for response in self.replica.stub.Generate(request):
                        await self._on_inference_event(response.event)
                    return
                except grpc.RpcError as exc:
                    if self.timeline.first_token is not None:
                        await self._continue_answer(exc)
                        return
                    if not self._may_fail_over(exc, retried):   # the status as the replica gave it
                        await self.out.put(AskFailed(exc.code(), f"inference failed: {exc.details()}"))
                        return
                    retried = True
                    await self._fail_over(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.out.put(exc)

    # --- inference events -----------------------------------------------------------------
    async def _on_inference_event(self, event: inference_pb2.InferenceEvent) -> None:
        kind = event.WhichOneof("kind")
        if kind == "lifecycle":
            await record_lifecycle(self.store, self.s.request_id, event.lifecycle)
            await self.out.put(orchestrator_pb2.AskEvent(lifecycle=event.lifecycle))
        elif kind == "token":
            if self.timeline.first_token is None:
                if self.prompt_stored is not None:   # no token out before its prompt is stored (resume.py)
                    await self.prompt_stored
                self.timeline.first_token = time.monotonic()
            token = event.token
            if self.continuing and self.continued_first_token_s is None and self.broke_at is not None:
                self.continued_first_token_s = time.monotonic() - self.broke_at
            if self.continuing:          # its position in the whole answer
                token = common_pb2.GeneratedToken()
                token.CopyFrom(event.token)
                token.index += self.before_tokens
            self.delivered_ids.append(token.id)
            self.answer += token.text
            await self.out.put(orchestrator_pb2.AskEvent(token=token))
        elif kind == "done":
            done = event.done
            if self.continuing:
                await self._record_continued(event.done.stats)
                done = whole_answer(done, self.before_text, self.before_tokens)
            await self.out.put(await self._done(done))

    async def _done(self, done: inference_pb2.InferenceDone) -> orchestrator_pb2.AskEvent:
        t = self.timeline
        end = t.retrieval_end or t.started
        ttft_q = (t.first_token - t.started) if t.first_token else 0.0
        ttft_r = (t.first_token - end) if t.first_token else 0.0
        total = time.monotonic() - t.started
        self.router.note_served(self.replica.address, preamble_key())
        await record_finished(self.store, self.s.request_id, done, ttft_from_question_s=ttft_q, total_s=total,
                              ttft_from_retrieval_end_s=ttft_r)
        retrieval_s = self.prompt.retrieval_s if self.prompt is not None else end - t.started
        return orchestrator_pb2.AskEvent(done=orchestrator_pb2.AskDone(
            answer=done.text, sources=self.prompt.sources if self.prompt is not None else [],
            ttft_from_question_s=ttft_q, ttft_from_retrieval_end_s=ttft_r, request_id=self.s.request_id,
            stats=done.stats, finish_reason=done.finish_reason, replica=self.replica.address,
            retrieval_s=retrieval_s, total_s=total,
            warnings=self.warnings.all))


def _lifecycle(kind: int, detail: str) -> orchestrator_pb2.AskEvent:
    return orchestrator_pb2.AskEvent(lifecycle=common_pb2.LifecycleEvent(
        kind=kind, monotonic_s=time.monotonic(), unix_ms=int(time.time() * 1000), detail=detail))


@dataclass
class AskFailed(Exception):
    code: grpc.StatusCode
    message: str
