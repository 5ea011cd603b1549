"""What the completion endpoints share: run a `Generation`, answer as one JSON body or as SSE.

Streaming uses sse-starlette's `EventSourceResponse` (OpenAI's framing: `data: {chunk}` events,
then `data: [DONE]`). The HTTP status is decided at the first token: an error before it is an
HTTP error with the error body; an error after it is a last `data: {"error": ...}` event. The
chunk that carries `finish_reason` also carries `streamrag` on the RAG path; with
`stream_options.include_usage` one more chunk with empty `choices` carries `usage`.
The orchestrator's warnings about the context (`streamrag.warnings`: a retriever that could not
serve, the crawler asked in its place, no sources and why) also go out as `X-Streamrag-Warning`
headers, one a warning: the headers leave with the first token, after retrieval has ended. A tenant
with a per-minute limit gets OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` on every
answer, the values when the orchestrator admitted it (a stream's headers leave first, as OpenAI's do).

A client that goes away cancels the gRPC call: while waiting for the first token or for a
non-streamed answer (`until_disconnected` listens for `http.disconnect`), and mid-stream
(sse-starlette cancels the event generator, whose `finally` cancels the call).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from gateway.errors import GatewayError
from gateway.generation import Finish, Generation
from gateway.protocol import GenerationRequest

T = TypeVar("T")
ChoiceFn = Callable[[str, "str | None"], dict[str, Any]]
CLIENT_CLOSED = 499          # nginx's status for "the client closed the request" (only metrics see it)
WARNING_HEADER = "X-Streamrag-Warning"


@dataclass(frozen=True)
class Shape:
    """How one endpoint writes its answers."""

    route: str
    id_prefix: str               # "chatcmpl" / "cmpl"
    object: str                  # the non-streamed body's "object"
    chunk_object: str            # each streamed chunk's "object"
    choice: ChoiceFn             # (text, finish_reason) -> the non-streamed choice
    delta: ChoiceFn              # (text, finish_reason) -> a streamed choice
    opening: dict[str, Any] | None = None    # a first streamed choice (chat: the role)


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or `ClientGone` (with `work` cancelled) if the client leaves first."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        raise ClientGone
    return task.result()


async def _collect(generation: Generation) -> tuple[str, Finish]:
    pieces = []
    async for output in generation.outputs():
        if isinstance(output, Finish):
            return "".join(pieces), output
        pieces.append(output)
    raise GatewayError(502, "the service ended the stream without a result")


async def respond(request: Request, body: GenerationRequest, shape: Shape,
                  open_generation: Callable[[str], Awaitable[Generation]]) -> Response:
    """Answer `body`: open the call, wait for its first token, then stream or collect."""
    arrived = time.monotonic()
    request_id = f"{shape.id_prefix}-{uuid.uuid4().hex}"
    generation = await open_generation(request_id)
    streaming = False
    try:
        await until_disconnected(request, generation.first_output())
        if generation.first_token_s is not None:
            request.app.state.metrics.ttft.labels(shape.route, generation.kind).observe(time.monotonic() - arrived)
        if body.stream:
            streaming = True            # from here the event generator owns the call
            return with_headers(EventSourceResponse(_events(shape, request_id, body, generation), sep="\n"),
                                generation)
        text, finish = await until_disconnected(request, _collect(generation))
        return with_headers(JSONResponse(_full_body(shape, request_id, body.model, text, finish)), generation)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if not streaming:
            generation.cancel()            # a no-op once the call has ended


def with_headers(response: Response, generation: Generation) -> Response:
    """`response` with the generation's warnings and its tenant's `x-ratelimit-*` values at admission."""
    response.headers.update(generation.rate_limits)
    return with_warnings(response, generation.warnings)


def with_warnings(response: Response, warnings: list[str]) -> Response:
    """`response` with one `X-Streamrag-Warning` header a warning (on one line, in ASCII: what a header carries)."""
    for warning in warnings:
        response.headers.append(WARNING_HEADER, " ".join(warning.split()).encode("ascii", "replace").decode())
    return response


def _full_body(shape: Shape, request_id: str, model: str, text: str, finish: Finish) -> dict[str, Any]:
    out = {"id": request_id, "object": shape.object, "created": int(time.time()), "model": model,
           "choices": [shape.choice(text, finish.reason)], "usage": finish.usage()}
    if finish.streamrag is not None:
        out["streamrag"] = finish.streamrag
    return out


async def _events(shape: Shape, request_id: str, body: GenerationRequest,
                  generation: Generation) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        out = {"id": request_id, "object": shape.chunk_object, "created": created, "model": body.model,
               "choices": choices, **extra}
        if body.include_usage:
            out.setdefault("usage", None)
        return json.dumps(out)

    try:
        if shape.opening is not None:
            yield chunk([shape.opening])
        async for output in generation.outputs():
            if isinstance(output, str):
                if output:
                    yield chunk([shape.delta(output, None)])
                continue
            extension = {"streamrag": output.streamrag} if output.streamrag is not None else {}
            yield chunk([shape.delta("", output.reason)], **extension)
            if body.include_usage:
                yield chunk([], usage=output.usage())
        yield "[DONE]"
    except GatewayError as exc:
        yield json.dumps(exc.body())
        yield "[DONE]"
    finally:
        generation.cancel()                # the client left (or the stream ended): free the engine's work
