"""A client that goes away mid-answer cancels the gRPC call: the engine aborts the request and
frees every KV block (polled with a bounded wait; nothing here asserts a time)."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.sync.client import connect

from gateway.protocol import RAG_MODEL

STORY = "Write a very long story about a dragon and a knight, with many chapters."


def _aborted(stack) -> int:
    return stack.inference.stats().counters.requests_aborted


def _leave_after_some_tokens(response: httpx.Response, tokens: int = 3) -> None:
    seen = 0
    for line in response.iter_lines():
        if line.startswith("data:") and '"content":"' in line.replace(" ", "") and '"content":""' not in line:
            seen += 1
            if seen == tokens:
                return


@pytest.mark.parametrize("model", ["served", RAG_MODEL])
def test_leaving_a_stream_frees_the_engines_blocks(gateway, gateway_stack, served_model, model):
    before = _aborted(gateway_stack)
    body = {"model": served_model if model == "served" else model, "max_tokens": 2000, "stream": True,
            "messages": [{"role": "user", "content": STORY}]}
    with httpx.stream("POST", f"{gateway.base_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        _leave_after_some_tokens(response)
    stats = gateway_stack.inference.wait_until_all_blocks_free(timeout_s=60)
    assert stats.counters.requests_aborted == before + 1


def test_leaving_before_a_non_streamed_answer_frees_the_engines_blocks(gateway, gateway_stack, served_model):
    before = _aborted(gateway_stack)
    body = {"model": served_model, "max_tokens": 2000, "messages": [{"role": "user", "content": STORY}]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=2))
    stats = gateway_stack.inference.wait_until_all_blocks_free(timeout_s=60)
    assert stats.counters.requests_aborted == before + 1


def test_leaving_the_websocket_frees_the_engines_blocks(gateway, gateway_stack):
    before = _aborted(gateway_stack)
    with connect(gateway.ws_url, open_timeout=30) as ws:
        ws.recv(timeout=30)
        ws.send(json.dumps({"type": "session.update", "session": {"max_tokens": 2000}}))
        ws.send(json.dumps({"type": "input.append", "text": STORY}))
        ws.send(json.dumps({"type": "input.commit"}))
        tokens = 0
        while tokens < 3:
            tokens += json.loads(ws.recv(timeout=60))["type"] == "token"
    stats = gateway_stack.inference.wait_until_all_blocks_free(timeout_s=60)
    assert stats.counters.requests_aborted == before + 1
