"""`POST /v1/completions`: a raw prompt (text, or token ids) continued by the served model, or
with `streamrag-rag` / `retrieval` the prompt asked as a question through `Orchestrator.Ask`.

The prompt is one segment as it is: no chat format is added.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from gateway.generation import start_generation
from gateway.protocol import CompletionRequest
from gateway.serving import Shape, respond
from gateway.tenancy import request_priority, tenant_of
from protos import common_pb2
from protos.metadata import identity_metadata


def _choice(text: str, reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}


COMPLETION = Shape(route="/v1/completions", id_prefix="cmpl", object="text_completion",
                   chunk_object="text_completion", choice=_choice, delta=_choice)


def prompt_segment(prompt: str | list[int]) -> common_pb2.Segment:
    if isinstance(prompt, str):
        return common_pb2.Segment(text=prompt)
    return common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=prompt))


async def create_completion(request: Request, body: CompletionRequest) -> Response:
    segment = prompt_segment(body.prompt)
    tenant = tenant_of(request.scope)
    identity = identity_metadata(tenant.name, tenant.weight, request_priority(request, body.priority))

    def open_generation(request_id: str):
        return start_generation(request.app.state.upstream, body, request_id,
                                question=body.prompt if isinstance(body.prompt, str) else "",
                                prompt=lambda chat: [segment], identity=identity)

    return await respond(request, body, COMPLETION, open_generation)
