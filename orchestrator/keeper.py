"""The keeper: keeps one answer going on the replicas, whatever fails under it.

An Ask (ask.py, whose relay feeds the prompt) and a plain `Generate` (inference_proxy.py) hand their
answer to a `Keeper`, which owns everything that makes it survive a failure:

- the replica it runs on, chosen by the caller's key, and the move off a replica that fails
  (fail_over.py; which statuses move, and how often: failures.py);
- before the first token, one retry on another replica (the caller sends it the prompt so far);
- the prompt's save (resume.py), and the first token held until the store's flush stored it, so a
  broken answer always has a prompt to continue from;
- after the first token, continuations (servicekit/continuation.py: the prompt plus the tokens
  delivered, the budget less them) on another replica, up to `MAX_CONTINUATIONS` replicas failing
  under one answer;
- a caller's re-issue (`AskRequest.resume`, or a plain call's `RESUME_KEY`): before the first token a
  retry, after it a continuation of what the caller has;
- the records of it (recording.py): each engine lifecycle event, RETRIED, RESUMED, CONTINUED.

What the caller sees goes to its `emit` as `InferenceEvent`s of the whole answer: tokens indexed in
it, and one `done` whose text and counts cover every continuation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc

from orchestrator.fail_over import fail_over
from orchestrator.failures import ask_fails_over, peer_wait_s, streamed_ask_status
from orchestrator.lifecycle_store import StoreUnavailable
from orchestrator.recording import record_continued, record_lifecycle, record_resumed, record_retried
from orchestrator.resume import PROMPT_FLUSH_S, continuation, end_of_answer, load_prompt, save_prompt, whole_answer
from orchestrator.router import NoReplicaAvailable, Replica
from protos import common_pb2, inference_pb2, orchestrator_pb2

log = logging.getLogger(__name__)

MAX_CONTINUATIONS = 3      # replicas that may fail under one answer after its first token before it fails

Emit = Callable[[inference_pb2.InferenceEvent], Awaitable[None]]


@dataclass
class AnswerFailed(Exception):
    """The answer cannot go on: the call ends with `code` and `message` (recorded FAILED by the servicer)."""

    code: grpc.StatusCode
    message: str


class Keeper:
    def __init__(self, request_id: str, router, store, emit: Emit, *, key: str, chat_formats,
                 time_remaining: Callable[[], float | None] = lambda: None, attempt: int = 0) -> None:
        self.request_id = request_id
        self.router = router
        self.store = store
        self.emit = emit
        self.key = key                          # the router's prefix key
        self.time_remaining = time_remaining    # the caller's deadline: seconds left, None without one
        self.chat_formats = chat_formats        # async (replica) -> ChatFormat: the model's end-of-sequence ids
        self.failure_prefix = "inference failed: "   # how a replica's failure reads to the caller
        self.attempt = attempt                  # the caller's re-issue (0: the first call)
        # A retry may land on a replica that still holds the broken request: a new inference id.
        self.inference_id = f"{request_id}@retry-{attempt}" if attempt else request_id
        self.replica: Replica | None = None
        self.prompt: orchestrator_pb2.AskPrompt | None = None   # once complete
        self.prompt_stored: asyncio.Task | None = None          # the store's flush after saving it
        self.started = time.monotonic()
        self.first_token: float | None = None
        self.delivered_ids: list[int] = []      # the answer's token ids sent to the caller
        self.answer = ""
        self.continuing = False                 # decoding a continuation
        self.before_text, self.before_tokens = "", 0   # what the continuation continues from
        self.continuations = 0
        self.broke_at: float | None = None      # monotonic: the break a continuation resumes from
        self.continued_first_token_s: float | None = None   # the break to the continuation's first token

    # --- the replica ------------------------------------------------------------------------
    async def choose(self) -> Replica:
        """A replica for the key, waiting a little for one when none is available (failures.py)."""
        self.replica = await self.router.choose_ready(self.key, wait_s=peer_wait_s(self.time_remaining()))
        return self.replica

    async def fail_over(self, exc: grpc.RpcError, record: bool = True, resumed_tokens: int | None = None) -> None:
        """Move to another replica (fail_over.py); `AnswerFailed(UNAVAILABLE)` when none is left."""
        failed = self.replica.address
        try:
            self.replica = await fail_over(self.router, self.store if record else None, self.request_id,
                                           self.replica, self.key, exc, self.time_remaining(),
                                           resumed_tokens=resumed_tokens)
        except NoReplicaAvailable as none:
            raise AnswerFailed(grpc.StatusCode.UNAVAILABLE, f"no replica left after {failed} failed "
                               f"({exc.code().name}): {none}") from exc

    def _failure(self, exc: grpc.RpcError) -> str:
        return f"{self.failure_prefix}{exc.details() or exc.code().name}"

    def may_retry(self, exc: grpc.RpcError, retried: bool) -> bool:
        """Before the first token, one move to another replica for a status that fails over."""
        return ask_fails_over(exc.code()) and not retried and self.first_token is None

    # --- the prompt ---------------------------------------------------------------------------
    async def save_prompt(self, prompt: orchestrator_pb2.AskPrompt) -> None:
        """The prompt is complete: keep it in the store, for any orchestrator to continue from; the
        first token waits for it to be stored (`on_event`). With Redis down the answer goes on."""
        self.prompt = prompt
        await save_prompt(self.store, self.request_id, prompt)
        if self.store.available:
            self.prompt_stored = asyncio.create_task(self.store.confirm(PROMPT_FLUSH_S))

    async def retried(self) -> None:
        """A re-issue that finds no tokens delivered: the request starts again (RETRIED)."""
        await record_retried(self.store, self.request_id, self.attempt)

    async def resumed(self, token_ids: Sequence[int], text: str,
                      prompt: orchestrator_pb2.AskPrompt | None = None) -> None:
        """A re-issue after `token_ids` (`text`): the prompt (`prompt`, else the one the store recorded), a
        replica, the record updated (RESUMED); `continue_answer` then decodes the rest."""
        tokens = len(token_ids)
        if prompt is None:
            try:
                prompt = await load_prompt(self.store, self.request_id)
            except StoreUnavailable as exc:
                raise AnswerFailed(grpc.StatusCode.UNAVAILABLE, f"request {self.request_id!r} cannot be resumed "
                                   f"while the lifecycle store is unavailable: {exc}") from exc
        if prompt is None:
            raise AnswerFailed(grpc.StatusCode.NOT_FOUND, f"no complete prompt is recorded for request "
                               f"{self.request_id!r}: it cannot continue after {tokens} tokens")
        if tokens > prompt.sampling.max_tokens:
            raise AnswerFailed(grpc.StatusCode.INVALID_ARGUMENT, f"resume has {tokens} tokens; request "
                               f"{self.request_id!r} allows {prompt.sampling.max_tokens}")
        self.prompt = prompt
        self.delivered_ids, self.answer = list(token_ids), text
        self.first_token = self.broke_at = self.started    # the caller saw the answer start, and break
        await self.choose()
        log.info("%s: resuming after %d tokens on %s (attempt %d)", self.request_id, tokens, self.replica.address,
                 self.attempt)
        await record_resumed(self.store, self.request_id, self.attempt, tokens, self.replica.address)

    # --- decoding -----------------------------------------------------------------------------
    async def generate(self, request: inference_pb2.GenerateRequest) -> None:
        """One `Generate` of the whole prompt: moved once before the first token (a failure that does
        not move ends the answer with the replica's own status), continued after it."""
        await self._keep(lambda: self.replica.stub.Generate(request), None, lambda code: code)

    async def read(self, call_of: Callable[[], object], reopen: Callable[[Replica], Awaitable[None]]) -> None:
        """The events of a streamed prompt (`call_of()`: the call now): before the first token a failure
        moves it once (`reopen(replica)` sends the prompt so far there), after it the answer continues."""
        await self._keep(call_of, reopen, streamed_ask_status)

    async def _keep(self, call_of: Callable[[], object], reopen: Callable[[Replica], Awaitable[None]] | None,
                    status_of: Callable[[grpc.StatusCode], grpc.StatusCode]) -> None:
        retried = False
        while True:
            try:
                async for response in call_of():
                    await self.on_event(response.event)
                return
            except grpc.RpcError as exc:
                if self.first_token is not None:
                    await self.continue_answer(exc)
                    return
                if not self.may_retry(exc, retried):
                    raise AnswerFailed(status_of(exc.code()), self._failure(exc)) from exc
                retried = True
                await self.fail_over(exc)
                if reopen is not None:
                    await reopen(self.replica)

    async def continue_answer(self, exc: grpc.RpcError | None = None) -> None:
        """Decode the rest of the answer from the prompt plus the tokens delivered, on the current
        replica or, after `exc`, on another one; up to MAX_CONTINUATIONS replicas fail under it."""
        while True:
            if exc is not None:
                self.broke_at = time.monotonic()
                if self.continuations >= MAX_CONTINUATIONS or not ask_fails_over(exc.code()) or self.prompt is None:
                    raise AnswerFailed(streamed_ask_status(exc.code()), self._failure(exc))
                self.continuations += 1
                await self.fail_over(exc, resumed_tokens=len(self.delivered_ids))
            self.continuing, self.before_text, self.before_tokens = True, self.answer, len(self.delivered_ids)
            self.continued_first_token_s = None
            request, ended = continuation(self.prompt, self.delivered_ids, self.request_id,
                                          await self._end_of_sequence())
            if request is None:
                await self._record_continued(None)
                await self.emit(inference_pb2.InferenceEvent(done=end_of_answer(self.answer, self.before_tokens,
                                                                                 ended)))
                return
            try:
                async for response in self.replica.stub.Generate(request):
                    await self.on_event(response.event)
                return
            except grpc.RpcError as again:
                exc = again

    async def _end_of_sequence(self) -> tuple[int, ...]:
        """The model's end-of-sequence ids (a continuation's stop tokens), unless the answer ignores them;
        none when the replica cannot say (its Generate then reports what is wrong with it)."""
        if self.prompt.sampling.ignore_eos:
            return ()
        try:
            return tuple((await self.chat_formats(self.replica)).eos_token_ids)
        except grpc.RpcError:
            return ()

    async def _record_continued(self, stats: common_pb2.RequestStats | None) -> None:
        """A CONTINUED event with what the continuation cost: the tokens it continued after (`tokens`),
        the KV its replica computed again for them (`tokens_computed`: the prompt plus those tokens, less
        `prefix_cache_hit_tokens`) and the time from the break to its first token (`first_token_s`;
        absent when no token was left to decode)."""
        fields = {"tokens": self.before_tokens, "replica": self.replica.address}
        if stats is not None:
            fields |= {"prompt_tokens": stats.prompt_tokens, "tokens_computed": stats.tokens_computed,
                       "prefix_cache_hit_tokens": stats.prefix_cache_hit_tokens}
        if self.continued_first_token_s is not None:
            fields["first_token_s"] = round(self.continued_first_token_s, 4)
        await record_continued(self.store, self.request_id, **fields)

    # --- what the caller sees -----------------------------------------------------------------
    async def on_event(self, event: inference_pb2.InferenceEvent) -> None:
        kind = event.WhichOneof("kind")
        if kind == "lifecycle":
            await record_lifecycle(self.store, self.request_id, event.lifecycle)
            await self.emit(event)
        elif kind == "token":
            if self.first_token is None:
                if self.prompt_stored is not None:   # no token out before its prompt is stored
                    await self.prompt_stored
                self.first_token = time.monotonic()
            if self.continuing and self.continued_first_token_s is None and self.broke_at is not None:
                self.continued_first_token_s = time.monotonic() - self.broke_at
            if self.continuing:          # its position in the whole answer
                moved = inference_pb2.InferenceEvent()
                moved.token.CopyFrom(event.token)
                moved.token.index += self.before_tokens
                event = moved
            self.delivered_ids.append(event.token.id)
            self.answer += event.token.text
            await self.emit(event)
        elif kind == "done":
            if self.continuing:
                await self._record_continued(event.done.stats)
                event = inference_pb2.InferenceEvent(done=whole_answer(event.done, self.before_text,
                                                                       self.before_tokens))
            await self.emit(event)

    async def close(self) -> None:
        if self.prompt_stored is not None:
            self.prompt_stored.cancel()
            await asyncio.gather(self.prompt_stored, return_exceptions=True)
