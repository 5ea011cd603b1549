"""One `Ask`, end to end: a relay and a keeper, draining into the caller's stream.

- The relay (relay.py) retrieves, merges and relays the context to the replica as it arrives
  (streaming on: one `StreamPrompt`; off, the baseline: one `Generate` once retrieval ended).
- The keeper (keeper.py) keeps the answer going on the replicas: it chooses the replica, retries
  once before the first token, saves the complete prompt, continues the answer on another replica
  when one fails after it, and continues a caller's re-issue (`AskRequest.resume`) from the prompt
  the store recorded and the tokens the caller has.

The retrievers, the relay and the inference reader are tasks feeding one queue (`out`) that `run()`
drains; the first failure that ends the Ask (`AskFailed`) ends the stream, and everything upstream
is cancelled with it. What the request's checks are: ask_settings.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc

from orchestrator.ask_settings import (
    DEFAULT_DEADLINE_MS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TOP_K,
    AskSettings,
    BadAsk,
    validate_ask,
)
from orchestrator.context_warnings import ContextWarnings
from orchestrator.keeper import AnswerFailed, Keeper
from orchestrator.pairing import Pair, choose_pair
from orchestrator.prompt import preamble_key
from orchestrator.recording import record_created, record_finished
from orchestrator.relay import Relay
from protos import inference_pb2, orchestrator_pb2, retriever_pb2_grpc

__all__ = ["DEFAULT_DEADLINE_MS", "DEFAULT_MAX_TOKENS", "DEFAULT_TOP_K", "AskFailed", "AskPipeline", "AskSettings",
           "BadAsk", "validate_ask"]

AskFailed = AnswerFailed      # what ends an Ask: a status and a message for its caller


class AskPipeline:
    def __init__(self, settings: AskSettings, router, retriever_stubs: dict[str, retriever_pb2_grpc.RetrieverStub],
                 store, chat_formats, time_remaining: Callable[[], float | None] = lambda: None) -> None:
        self.s = settings
        self.router = router
        self.retriever_stubs = retriever_stubs
        self.store = store
        self.chat_formats = chat_formats      # async (replica) -> ChatFormat (Describe, cached)
        self.out: asyncio.Queue = asyncio.Queue()
        self.tasks: list[asyncio.Task] = []
        self.warnings = ContextWarnings(settings.request_id, store, self.out)   # context_warnings.py
        attempt = settings.resume.attempt if settings.resume is not None else 0
        self.keeper = Keeper(settings.request_id, router, store, self._emit, key=preamble_key(),
                             chat_formats=chat_formats, time_remaining=time_remaining, attempt=attempt)
        self.relay = Relay(settings, retriever_stubs, store, self.out, self.warnings, self.keeper, time_remaining)

    @property
    def resuming(self) -> bool:
        """A re-issued Ask whose caller already has tokens: the keeper continues the answer."""
        return self.s.resume is not None and len(self.s.resume.token_ids) > 0

    # --- the caller's view ------------------------------------------------------------
    async def run(self) -> AsyncIterator[orchestrator_pb2.AskEvent]:
        keeper, relay = self.keeper, self.relay
        if self.resuming:
            await keeper.resumed(self.s.resume.token_ids, self.s.resume.text)
        else:
            chat, pair = await self._choose_replica()
            await record_created(self.store, self.s.request_id, self.s.question, retriever=",".join(self.s.retrievers)
                                 or "none", streamed=self.s.streamed, replica=keeper.replica.address)
            self.s = relay.s = await self.warnings.plan(self.s, self.retriever_stubs)
            if self.s.resume is not None:
                await keeper.retried()
        s = self.s
        yield orchestrator_pb2.AskEvent(started=orchestrator_pb2.AskStarted(
            request_id=s.request_id, replica=keeper.replica.address, retriever=s.choice, streamed=s.streamed))
        retrieval: asyncio.Queue = asyncio.Queue()
        try:
            if self.resuming:
                self.tasks.append(asyncio.create_task(relay.guarded(keeper.continue_answer())))
            else:
                for name in s.retrievers:
                    self.tasks.append(asyncio.create_task(relay.retrieve(name, retrieval)))
                work = (relay.streaming(chat, retrieval, pair, self.tasks) if s.streamed
                        else relay.baseline(chat, retrieval))
                self.tasks.append(asyncio.create_task(relay.guarded(work)))
            while True:
                item = await self.out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.WhichOneof("kind") == "done":
                    return
        finally:   # done, failed or the caller went away: stop everything upstream
            if relay.session is not None:
                relay.session.call.cancel()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await keeper.close()

    async def _choose_replica(self) -> tuple[inference_pb2.ChatFormat, Pair]:
        """Pick a replica (waiting a little for one when none is available: failures.py) and read its
        chat format; a replica that fails here is replaced once."""
        keeper = self.keeper
        await keeper.choose()
        pair = choose_pair(self.router, preamble_key(), keeper.replica) if self.s.streamed else Pair(keeper.replica)
        keeper.replica = pair.prefill
        try:
            chat = await self.chat_formats(keeper.replica)
        except grpc.RpcError as exc:      # any failure to describe itself: the replica is unusable (failures.py)
            await keeper.fail_over(exc, record=False)     # the request is not in the store yet
            chat = await self.chat_formats(keeper.replica)
        return chat, pair

    async def _emit(self, event: inference_pb2.InferenceEvent) -> None:
        """The keeper's events of the whole answer, as the Ask's."""
        kind = event.WhichOneof("kind")
        if kind == "lifecycle":
            await self.out.put(orchestrator_pb2.AskEvent(lifecycle=event.lifecycle))
        elif kind == "token":
            await self.out.put(orchestrator_pb2.AskEvent(token=event.token))
        elif kind == "done":
            await self.out.put(await self._done(event.done))

    async def _done(self, done: inference_pb2.InferenceDone) -> orchestrator_pb2.AskEvent:
        keeper, started = self.keeper, self.keeper.started
        end = self.relay.retrieval_end or started
        ttft_q = (keeper.first_token - started) if keeper.first_token else 0.0
        ttft_r = (keeper.first_token - end) if keeper.first_token else 0.0
        total = time.monotonic() - started
        self.router.note_served(keeper.replica.address, preamble_key())
        await record_finished(self.store, self.s.request_id, done, ttft_from_question_s=ttft_q, total_s=total,
                              ttft_from_retrieval_end_s=ttft_r)
        prompt = keeper.prompt
        retrieval_s = prompt.retrieval_s if prompt is not None else end - started
        return orchestrator_pb2.AskEvent(done=orchestrator_pb2.AskDone(
            answer=done.text, sources=prompt.sources if prompt is not None else [],
            ttft_from_question_s=ttft_q, ttft_from_retrieval_end_s=ttft_r, request_id=self.s.request_id,
            stats=done.stats, finish_reason=done.finish_reason, replica=keeper.replica.address,
            retrieval_s=retrieval_s, total_s=total, warnings=self.warnings.all))
