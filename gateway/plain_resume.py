"""A plain generation that survives the orchestrator serving it, as an Ask does (servicekit/ask_resume.py).

`ResumableGenerate` reads an `Inference.Generate` stream on the orchestrator and keeps the answer's
token ids and text as they arrive. When the stream breaks UNAVAILABLE (the orchestrator died, or
its keepalive found it frozen) it re-issues the call under the same request id to a live
orchestrator as the answer's continuation (servicekit/continuation.py): the prompt, then the tokens
it has as one more segment, `max_tokens` less them, with `protos.metadata.RESUME_KEY` saying which
re-issue it is and how many tokens it has. The orchestrator's keeper continues from there, indexing
the tokens in the whole answer; the caller sees one answer, and the `done`'s text and counts are
the whole answer's. When nothing is left to decode (every token arrived, or the last was a stop
token), no call is made: the answer ends as it is. Before the first token the re-issue is the same
request again (a retry). Any other status, and the UNAVAILABLE of the last of `MAX_REISSUES`
re-issues, is the call's result.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from protos import common_pb2, inference_pb2
from protos.metadata import RESUME_KEY
from servicekit.ask_resume import MAX_REISSUES, RESUMABLE, told_to_retry_later
from servicekit.continuation import STOP, budget, continue_after

log = logging.getLogger(__name__)


class ResumableGenerate:
    """`async for response in ResumableGenerate(generate, request, stop_token_ids)`; `generate(request,
    metadata)` opens one call with that extra metadata; `cancel()` cancels the call in flight."""

    def __init__(self, generate: Callable[[inference_pb2.GenerateRequest, tuple], Any],
                 request: inference_pb2.GenerateRequest, stop_token_ids: Sequence[int] = (), *,
                 max_reissues: int = MAX_REISSUES) -> None:
        self._generate = generate
        self.request = request
        self.stop_token_ids = tuple(stop_token_ids)    # the request's and the model's end-of-sequence ids
        self.max_reissues = max_reissues
        self.token_ids: list[int] = []
        self.text = ""
        self.attempt = 0
        self.before_text = ""                # what the caller had when the call now open was re-issued
        self.call: Any = None
        self._cancelled = False

    def __aiter__(self) -> AsyncIterator[inference_pb2.GenerateResponse]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[inference_pb2.GenerateResponse]:
        request, metadata = self.request, ()
        while True:
            self.call = self._generate(request, metadata)
            try:
                async for response in self.call:
                    kind = response.event.WhichOneof("kind")
                    if kind == "token":
                        if response.event.token.index < len(self.token_ids):
                            continue            # the caller has it already
                        self.token_ids.append(response.event.token.id)
                        self.text += response.event.token.text
                    elif kind == "done" and self.before_text:
                        response.event.done.text = self.before_text + response.event.done.text
                    yield response
                return
            except grpc.RpcError as exc:
                if (self._cancelled or exc.code() not in RESUMABLE or self.attempt >= self.max_reissues
                        or told_to_retry_later(exc)):       # shed by the orchestrator: an answer, not a break
                    raise
                self.attempt += 1
                log.warning("generation %s broke (%s: %s) after %d tokens; re-issuing it (attempt %d)",
                            self.request.request_id, exc.code().name, exc.details(), len(self.token_ids),
                            self.attempt)
            rest = continue_after(self.token_ids, budget(self.request.sampling.max_tokens), self.stop_token_ids)
            if rest.nothing_left:
                yield self._ended(rest.ended)
                return
            request = self._continuation(rest.max_tokens)
            metadata = ((RESUME_KEY, f"{self.attempt}:{len(self.token_ids)}"),)
            self.before_text = self.text

    def _continuation(self, max_tokens: int) -> inference_pb2.GenerateRequest:
        """The prompt, then the tokens the caller has, for the `max_tokens` left."""
        request = inference_pb2.GenerateRequest()
        request.CopyFrom(self.request)
        if self.token_ids:
            request.segments.append(common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=self.token_ids)))
            request.sampling.max_tokens = max_tokens
        return request

    def _ended(self, ended: str) -> inference_pb2.GenerateResponse:
        """The end of an answer with nothing left to decode: it ends as the caller has it."""
        reason = common_pb2.FINISH_REASON_STOP if ended == STOP else common_pb2.FINISH_REASON_LENGTH
        done = inference_pb2.InferenceDone(text=self.text, finish_reason=reason)
        done.stats.generated_tokens = len(self.token_ids)
        return inference_pb2.GenerateResponse(event=inference_pb2.InferenceEvent(done=done))

    def cancel(self) -> None:
        self._cancelled = True
        if self.call is not None:
            self.call.cancel()
