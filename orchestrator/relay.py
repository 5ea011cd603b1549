"""The relay: an Ask's retrieval, merged and relayed to its replica as it arrives.

Streaming on: open `StreamPrompt` with the head (instructions + question) at once, relay every
retrieved chunk as it arrives (`append` / `update` on the merged document list, documents.py),
`finish` with the suffix when retrieval ends or its deadline passes. Streaming off (the baseline):
wait for retrieval to end, then one `Generate` with the very same segments.

Each retriever is its own task feeding one queue; one that fails or stalls only ends its own
contribution (an UNAVAILABLE before its first chunk is tried once more when it is back; the statuses:
failures.py), and the caller is told (context_warnings.py). Once the prompt is complete it goes to
the keeper (keeper.py), which saves it and keeps the answer going on the replicas.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc

from orchestrator.ask_settings import AskSettings
from orchestrator.context_warnings import ContextWarnings
from orchestrator.documents import MergedDocuments
from orchestrator.failures import peer_wait_s, retrieval_retries_when_ready, retriever_refused_question
from orchestrator.inference_session import InferenceSession
from orchestrator.keeper import AnswerFailed, Keeper
from orchestrator.pairing import Pair
from orchestrator.prompt import document_segment, head_segments, suffix_segments
from orchestrator.recording import record_chunk, record_error
from protos import common_pb2, inference_pb2, orchestrator_pb2, retriever_pb2, retriever_pb2_grpc

log = logging.getLogger(__name__)


def lifecycle_event(kind: int, detail: str) -> orchestrator_pb2.AskEvent:
    return orchestrator_pb2.AskEvent(lifecycle=common_pb2.LifecycleEvent(
        kind=kind, monotonic_s=time.monotonic(), unix_ms=int(time.time() * 1000), detail=detail))


class Relay:
    """One Ask's retrieval and its relay to the keeper's replica; what the caller sees goes to `out`."""

    def __init__(self, settings: AskSettings, retriever_stubs: dict[str, retriever_pb2_grpc.RetrieverStub], store,
                 out: asyncio.Queue, warnings: ContextWarnings, keeper: Keeper,
                 time_remaining: Callable[[], float | None]) -> None:
        self.s = settings
        self.retriever_stubs = retriever_stubs
        self.store = store
        self.out = out
        self.warnings = warnings
        self.keeper = keeper
        self.time_remaining = time_remaining
        # With both retrievers, crawler pages are placed by relevance (orchestrator/documents.py).
        self.docs = MergedDocuments(by_relevance=settings.choice == orchestrator_pb2.RETRIEVER_CHOICE_BOTH)
        self.started = keeper.started
        self.retrieval_end: float | None = None
        self.session: InferenceSession | None = None

    # --- retrieval ----------------------------------------------------------------------
    async def retrieve(self, name: str, retrieval: asyncio.Queue) -> None:
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
                await self.out.put(AnswerFailed(exc.code(), f"retriever {name}: {exc.details()}"))
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
        left = self.started + self.s.deadline_s - time.monotonic()
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
        await self.out.put(lifecycle_event(common_pb2.LIFECYCLE_EVENT_KIND_ERROR, f"retriever {name}: {detail}"))
        await self.warnings.retriever_failed(name, detail)

    async def _retrieved(self, retrieval: asyncio.Queue) -> AsyncIterator[tuple[str, retriever_pb2.ContextChunk]]:
        """Yield (source, chunk) until every retriever is done or the deadline passes."""
        pending = set(self.s.retrievers)
        deadline = self.started + self.s.deadline_s
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
        self.retrieval_end = time.monotonic()

    async def _note_chunk(self, name: str, chunk: retriever_pb2.ContextChunk) -> None:
        await record_chunk(self.store, self.s.request_id, name, chunk)
        await self.out.put(orchestrator_pb2.AskEvent(retrieval=orchestrator_pb2.RetrievalProgress(
            seq=chunk.seq, mode=chunk.mode, num_documents=len(self.docs.all), final=chunk.final, source=name,
            elapsed_s=time.monotonic() - self.started,
            documents=[common_pb2.Document(id=d.id, title=d.title, url=d.url, score=d.score, source=name)
                       for d in chunk.documents])))

    def _prompt(self, segments: list[common_pb2.Segment]) -> orchestrator_pb2.AskPrompt:
        """The complete prompt and its sources, as the keeper saves it."""
        end = self.retrieval_end or self.started
        return orchestrator_pb2.AskPrompt(
            segments=segments, sampling=self.s.sampling, retrieval_s=end - self.started,
            sources=[common_pb2.Document(id=d.id, title=d.title, url=d.url, score=d.score, source=d.source)
                     for d in self.docs.all])

    # --- streaming relay ----------------------------------------------------------------
    async def streaming(self, chat, retrieval: asyncio.Queue, pair: Pair, tasks: list[asyncio.Task]) -> None:
        """The prompt as retrieval goes, on one StreamPrompt call; its reader (the keeper's) is a task."""
        keeper, question = self.keeper, self.s.question
        session = self.session = InferenceSession(keeper.replica.stub, self.s.request_id, self.s.sampling,
                                                  pair.metadata if pair.prefill is keeper.replica else ())
        tasks.append(asyncio.create_task(self.guarded(keeper.read(lambda: session.call,
                                                                  lambda replica: session.reopen(replica.stub)))))
        await session.send(inference_pb2.PromptUpdate(open=inference_pb2.PromptOpen(
            request_id=keeper.inference_id, sampling=self.s.sampling, segments=head_segments(chat, question))))
        async for name, chunk in self._retrieved(retrieval):
            action, docs = self.docs.apply(chunk)
            await self._note_chunk(name, chunk)
            if action == "append":
                await session.send(inference_pb2.PromptUpdate(append=inference_pb2.PromptAppend(
                    segments=[document_segment(d) for d in docs])))
            elif action == "update":
                await session.send(inference_pb2.PromptUpdate(update=inference_pb2.PromptReplace(
                    segments=[document_segment(d) for d in docs], final_stage=chunk.final)))
        documents = [document_segment(d) for d in self.docs.all]
        await keeper.save_prompt(self._prompt(head_segments(chat, question) + documents
                                              + suffix_segments(chat, question)))
        await session.send(inference_pb2.PromptUpdate(finish=inference_pb2.PromptFinish(
            segments=suffix_segments(chat, question))))
        await session.close()

    # --- non-streaming baseline ---------------------------------------------------------
    async def baseline(self, chat, retrieval: asyncio.Queue) -> None:
        async for name, chunk in self._retrieved(retrieval):
            self.docs.apply(chunk)
            await self._note_chunk(name, chunk)
        segments = (head_segments(chat, self.s.question) + [document_segment(d) for d in self.docs.all]
                    + suffix_segments(chat, self.s.question))
        await self.keeper.save_prompt(self._prompt(segments))
        await self.keeper.generate(inference_pb2.GenerateRequest(request_id=self.keeper.inference_id,
                                                                 segments=segments, sampling=self.s.sampling))

    async def guarded(self, work) -> None:
        """Run `work`; what it raises ends the Ask (the caller reads it from `out`)."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.out.put(exc)
