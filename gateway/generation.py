"""One generation on a service, as the HTTP side sees it: text pieces, then a `Finish`.

`start_generation` decides what a request asks the orchestrator: `Orchestrator.Ask` when it
wants retrieval (model `streamrag-rag` or a `retrieval` field), else `Inference.Generate` on
its `Inference` service (a replica its router picks; the request is recorded like an Ask), with
the prompt built by the endpoint for the served model's chat format. Both survive the orchestrator
serving them: an Ask is re-issued as a resume (`servicekit.ask_resume`), a plain generation as its
continuation (`gateway/plain_resume.py`).

A `Generation` wraps the gRPC call. `first_output()` waits for the first token (or the end):
an error before it is an HTTP error status; after it, the stream is already answered with 200
and an error ends it as its last event. It then reads the `x-ratelimit-*` values the orchestrator
sent at admission (initial metadata), which go out as the answer's headers. `cancel()` cancels the
call, which is what makes the orchestrator abort its request and the engine free the request's KV
blocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from gateway.errors import GatewayError, from_grpc, limit_headers
from gateway.plain_resume import ResumableGenerate
from gateway.protocol import RAG_MODEL, GenerationRequest, RetrievalOptions, Sampling
from gateway.upstream import Upstream
from protos import common_pb2, inference_pb2, orchestrator_pb2
from protos.retrievers import RETRIEVER_CHOICES
from servicekit.ask_resume import ResumableAsk

FINISH_REASONS = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length"}
REQUEST_TIMEOUT_S = 600.0


@dataclass
class Finish:
    """The end of a generation: why, the token counts, and what the RAG path adds (`streamrag`)."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    streamrag: dict[str, Any] | None = None

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def finish_reason(code: int, detail: str) -> str:
    """OpenAI's finish_reason for the services' FinishReason; an abort or error is a 502/504."""
    if code in FINISH_REASONS:
        return FINISH_REASONS[code]
    if code == common_pb2.FINISH_REASON_ABORT:
        raise GatewayError(504, f"generation aborted: {detail or 'deadline or shutdown'}", code="aborted")
    raise GatewayError(502, f"generation failed: {detail or 'engine error'}", code="engine_error")


def retriever_choice(retrieval: RetrievalOptions | None) -> int:
    """The Ask's retriever choice; one the request left unsaid stays unset (0), so that the orchestrator's default
    applies with its fall-back to the crawler while that default cannot serve (orchestrator/context_warnings.py)."""
    if retrieval is None or "retriever" not in retrieval.model_fields_set:
        return orchestrator_pb2.RETRIEVER_CHOICE_UNSPECIFIED
    return RETRIEVER_CHOICES[retrieval.retriever]


def sampling_params(request: Sampling) -> common_pb2.SamplingParams:
    sampling = common_pb2.SamplingParams(temperature=request.temperature or 0.0, top_p=request.top_p or 0.0,
                                         max_tokens=request.token_limit() or 0, stop=request.stop_strings)
    if request.seed is not None:
        sampling.seed = request.seed
    return sampling


def _document(doc: common_pb2.Document) -> dict[str, Any]:
    return {"id": doc.id, "title": doc.title, "url": doc.url, "score": round(doc.score, 6), "source": doc.source}


def _ask_finish(done: orchestrator_pb2.AskDone) -> Finish:
    return Finish(finish_reason(done.finish_reason, ""), done.stats.prompt_tokens,
                  done.stats.generated_tokens, {
                      "request_id": done.request_id, "replica": done.replica,
                      "sources": [_document(doc) for doc in done.sources],
                      "ttft_from_question_s": round(done.ttft_from_question_s, 4),
                      "retrieval_s": round(done.retrieval_s, 4),
                      "warnings": list(done.warnings)})        # why sources are missing or from elsewhere


def _inference_finish(done: inference_pb2.InferenceDone) -> Finish:
    return Finish(finish_reason(done.finish_reason, done.finish_detail), done.stats.prompt_tokens,
                  done.stats.generated_tokens)


@dataclass(eq=False)
class Generation:
    """A streaming gRPC call whose events are tokens and a `done` (Ask or Inference)."""

    call: Any
    to_finish: Callable[[Any], Finish]
    kind: str                                   # "rag" or "plain" (metrics)
    started: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None
    warnings: list[str] = field(default_factory=list)    # the orchestrator's, as they came (response headers)
    rate_limits: dict[str, str] = field(default_factory=dict)   # x-ratelimit-* at admission (response headers)
    _pending: list[str | Finish] = field(default_factory=list)
    _events: AsyncIterator[str | Finish] | None = None

    async def _outputs(self) -> AsyncIterator[str | Finish]:
        try:
            async for response in self.call:
                event = response.event
                kind = event.WhichOneof("kind")
                if kind == "token":
                    if self.first_token_s is None:
                        self.first_token_s = time.monotonic() - self.started
                    yield event.token.text
                elif kind == "warning":
                    self.warnings.append(event.warning)
                elif kind == "done":
                    yield self.to_finish(event.done)
                    return
        except grpc.RpcError as exc:
            raise from_grpc(exc) from None
        raise GatewayError(502, "the service ended the stream without a result")

    async def first_output(self) -> None:
        """Wait for the first token or the end; a failure before it raises `GatewayError`."""
        self._events = self._outputs()
        self._pending.append(await anext(self._events))
        await self._read_rate_limits()

    async def _read_rate_limits(self) -> None:
        """The `x-ratelimit-*` values the orchestrator sent when it admitted the call that answered."""
        call = getattr(self.call, "call", None)          # the resumable call's current gRPC call
        if call is None:
            return
        try:
            self.rate_limits = limit_headers(await call.initial_metadata())
        except Exception:                                # none came: nothing to send
            return

    async def outputs(self) -> AsyncIterator[str | Finish]:
        """Every output from the first on: token texts, then one `Finish`."""
        if self._events is None:
            await self.first_output()
        while self._pending:
            yield self._pending.pop(0)
        async for output in self._events:
            yield output

    def cancel(self) -> None:
        with contextlib.suppress(Exception):
            self.call.cancel()


async def start_generation(upstream: Upstream, request: GenerationRequest, request_id: str, *,
                           question: str, prompt: Callable[[inference_pb2.ChatFormat], list[common_pb2.Segment]],
                           identity: tuple[tuple[str, str], ...] = ()) -> Generation:
    """Open the call for `request`: an Ask when it wants retrieval, else a Generate (both on the orchestrator).
    `identity`: the tenant and priority metadata (gateway/tenancy.py)."""
    sampling = sampling_params(request)
    if request.uses_retrieval:
        if request.model != RAG_MODEL:
            await upstream.model_info(request.model)          # 404 for a model no replica serves
        retrieval = request.retrieval
        ask = orchestrator_pb2.AskRequest(
            question=question, request_id=request_id, sampling=sampling, max_tokens=sampling.max_tokens,
            retriever=retriever_choice(retrieval),
            collection=retrieval.collection if retrieval else "", top_k=(retrieval.top_k or 0) if retrieval else 0)
        # An orchestrator dying mid-answer: the Ask is re-issued to another as a resume (one answer).
        call = ResumableAsk(lambda request: upstream.orchestrator.Ask(request, timeout=REQUEST_TIMEOUT_S,
                                                                      metadata=(*upstream.metadata, *identity)),
                            ask)
        return Generation(call, _ask_finish, "rag")
    info = await upstream.model_info(request.model)
    generate = inference_pb2.GenerateRequest(request_id=request_id, segments=prompt(info.chat_format),
                                             sampling=sampling)
    # An orchestrator dying mid-answer: the call is re-issued to another as its continuation (one answer).
    stop_token_ids = (*sampling.stop_token_ids, *info.chat_format.eos_token_ids)
    call = ResumableGenerate(lambda request, resume: upstream.inference.Generate(
        request, timeout=REQUEST_TIMEOUT_S, metadata=(*upstream.plain_metadata(question), *identity, *resume)),
        generate, stop_token_ids)
    return Generation(call, _inference_finish, "plain")
