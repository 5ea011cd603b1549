"""`POST /v1/chat/completions`: messages in the served model's chat format, or a RAG question.

A plain chat (the served model's name) is one `Inference.Generate` of `chat_segments`
(gateway/chat_prompt.py). `streamrag-rag` or a `retrieval` field asks the last user message
through `Orchestrator.Ask`; earlier messages are not sent (Ask takes one question).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from gateway.chat_prompt import chat_segments
from gateway.generation import start_generation
from gateway.protocol import ChatCompletionRequest
from gateway.serving import Shape, respond
from gateway.tenancy import request_priority, tenant_of
from protos.metadata import identity_metadata


def _choice(text: str, reason: str | None) -> dict[str, Any]:
    return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason, "logprobs": None}


def _delta(text: str, reason: str | None) -> dict[str, Any]:
    return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": reason, "logprobs": None}


CHAT = Shape(route="/v1/chat/completions", id_prefix="chatcmpl", object="chat.completion",
             chunk_object="chat.completion.chunk", choice=_choice, delta=_delta,
             opening={"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                      "logprobs": None})


async def create_chat_completion(request: Request, body: ChatCompletionRequest) -> Response:
    messages = [(message.role, message.text) for message in body.messages]
    tenant = tenant_of(request.scope)
    identity = identity_metadata(tenant.name, tenant.weight, request_priority(request, body.priority))

    def open_generation(request_id: str):
        return start_generation(request.app.state.upstream, body, request_id, question=body.question,
                                prompt=lambda chat: chat_segments(chat, messages), identity=identity)

    return await respond(request, body, CHAT, open_generation)
