"""An Ask that survives the orchestrator serving it: the client re-issues it as a resume.

The gateway (`gateway/generation.py`) and `streamrag ask` read an `Orchestrator.Ask` stream
through `ResumableAsk`. It keeps the answer's token ids and text as they arrive; when the stream
breaks UNAVAILABLE (the orchestrator died, its connection closed, or its keepalive found it frozen)
it sends the Ask again under the same request id, with `resume` naming what it already has
(`AskRequest.resume`: token ids, text, attempt). The orchestrator that gets it continues the
answer from the prompt the lifecycle store recorded plus those tokens (orchestrator/resume.py);
before the first token it is a plain retry. Tokens the caller already has are never passed on
twice (a token whose `index` is below the count received is dropped), so the caller sees one
answer. The channel (`servicekit.channels.spread_target` / `spread_options`) spreads asks over
every orchestrator with gRPC's round_robin and health checking, so the re-issue goes to a live
one, and waits for one to be ready within the call's timeout.

Any other status (the orchestrator's own answer: INVALID_ARGUMENT, NOT_FOUND, ...) is the Ask's
result and passes on, as does the UNAVAILABLE of the last of `max_reissues` re-issues (`MAX_REISSUES`: a
caller's limit, apart from the orchestrator's own `MAX_CONTINUATIONS` on replicas that fail under one
answer). This module knows messages only by their fields (it sits below `protos`): `request` is an
`AskRequest`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)

RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
MAX_REISSUES = 3               # times a caller re-issues one broken call to another orchestrator


def told_to_retry_later(exc: grpc.RpcError) -> bool:
    """An orchestrator's answer, not a broken one: it shed the ask and said when to retry (`retry-after`)."""
    try:
        return any(key == "retry-after" for key, _ in exc.trailing_metadata() or ())   # protos.metadata's key
    except Exception:
        return False


class ResumableAsk:
    """`async for response in ResumableAsk(stub.Ask-like callable, request)`; `cancel()` cancels the
    call in flight. `ask(request)` opens one call (timeout and metadata are the caller's)."""

    def __init__(self, ask: Callable[[Any], Any], request: Any, *, max_reissues: int = MAX_REISSUES) -> None:
        self._ask = ask
        self.request = request
        if not request.request_id:      # a resume names the Ask it resumes
            request.request_id = uuid.uuid4().hex
        self.max_reissues = max_reissues
        self.token_ids: list[int] = []
        self.text = ""
        self.attempt = 0
        self.call: Any = None
        self._cancelled = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[Any]:
        while True:
            self.call = self._ask(self._next_request())
            try:
                async for response in self.call:
                    event = response.event
                    if event.WhichOneof("kind") == "token":
                        if self.attempt and event.token.index < len(self.token_ids):
                            continue            # the caller has it already
                        self.token_ids.append(event.token.id)
                        self.text += event.token.text
                    yield response
                return
            except grpc.RpcError as exc:
                if (self._cancelled or exc.code() not in RESUMABLE or self.attempt >= self.max_reissues
                        or told_to_retry_later(exc)):
                    raise
                self.attempt += 1
                log.warning("ask %s broke (%s: %s) after %d tokens; re-issuing it (attempt %d)", self.request_id,
                            exc.code().name, exc.details(), len(self.token_ids), self.attempt)

    def _next_request(self) -> Any:
        if not self.attempt:
            return self.request
        request = type(self.request)()
        request.CopyFrom(self.request)
        request.resume.attempt = self.attempt
        request.resume.token_ids.extend(self.token_ids)
        request.resume.text = self.text
        return request

    def cancel(self) -> None:
        self._cancelled = True
        if self.call is not None:
            self.call.cancel()
