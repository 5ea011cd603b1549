"""`GET /v1/models` and `GET /v1/models/{model}`: `streamrag-rag` and every model the
reachable replicas serve (their `Inference.Describe` names)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from gateway.errors import model_not_found
from gateway.protocol import RAG_MODEL

STARTED = 0    # "created": the services do not say when a model was made


def _card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": STARTED, "owned_by": "streamrag"}


async def model_names(request: Request) -> list[str]:
    return [RAG_MODEL, *await request.app.state.upstream.served_models()]


async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_card(model) for model in await model_names(request)]}


async def retrieve_model(request: Request, model: str) -> dict[str, Any]:
    if model not in await model_names(request):
        raise model_not_found(model)
    return _card(model)
