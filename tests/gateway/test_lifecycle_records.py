"""Every gateway request is in the Redis lifecycle store like an Ask: plain chats and completions
(`Generate` through the orchestrator's `Inference` service), the WebSocket's streamed input, a
client that leaves; read back with `Orchestrator.GetRequest` from the stack's real Redis, and
counted in the orchestrator's metrics (mode "plain")."""

from __future__ import annotations

import json
import time

import grpc
import httpx
from websockets.sync.client import connect

from orchestrator.lifecycle_store import LifecycleStore
from protos import orchestrator_pb2
from tests.gateway.test_disconnect import STORY

QUESTION = "What is the capital of France?"


def _record(stack, request_id: str, state: int = orchestrator_pb2.REQUEST_STATE_FINISHED,
            timeout_s: float = 30.0) -> orchestrator_pb2.RequestRecord:
    """The stored record once it reached `state` (the store writes in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            record = stack.stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=request_id), timeout=30).record
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND or time.monotonic() > deadline:
                raise
        else:
            if record.state == state or time.monotonic() > deadline:
                return record
        time.sleep(0.1)


def _plain_asks(stack, outcome: str) -> float:
    registry = stack.orchestrator.service.metrics.registry
    return registry.get_sample_value("streamrag_asks_total", {"mode": "plain", "outcome": outcome}) or 0.0


def test_a_plain_chat_is_recorded_with_its_lifecycle_answer_and_statistics(client, served_model, gateway_stack):
    answered = _plain_asks(gateway_stack, "answered")
    messages = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}]
    response = client.chat.completions.create(model=served_model, max_tokens=6, temperature=0, messages=messages)
    record = _record(gateway_stack, response.id)
    assert record.question == QUESTION                       # the user's last message, not the template
    assert record.retriever == orchestrator_pb2.RETRIEVER_CHOICE_NONE and not record.streamed
    assert record.answer == response.choices[0].message.content
    assert record.replica == gateway_stack.inference.address
    assert record.stats.prompt_tokens == response.usage.prompt_tokens
    assert record.stats.generated_tokens == response.usage.completion_tokens
    assert record.ttft_from_question_s > 0
    kinds = [event.kind for event in record.events]
    assert {"QUEUED", "SCHEDULED"} <= set(kinds) and kinds[-1] == "DONE", kinds
    assert _plain_asks(gateway_stack, "answered") == answered + 1


def test_a_streamed_completion_is_recorded_too(client, served_model, gateway_stack):
    stream = client.completions.create(model=served_model, prompt="The capital of France is", max_tokens=4,
                                       temperature=0, stream=True)
    chunks = list(stream)
    record = _record(gateway_stack, chunks[0].id)
    assert record.question == "The capital of France is"
    assert record.answer == "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)


def test_a_client_that_leaves_is_recorded_as_cancelled(gateway, gateway_stack, served_model):
    body = {"model": served_model, "max_tokens": 2000, "stream": True,
            "messages": [{"role": "user", "content": STORY}]}
    request_id, tokens = None, 0
    with httpx.stream("POST", f"{gateway.base_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                chunk = json.loads(line.removeprefix("data:"))
                request_id = request_id or chunk["id"]
                tokens += bool(chunk["choices"] and chunk["choices"][0]["delta"].get("content"))
                if tokens == 3:
                    break
    gateway_stack.inference.wait_until_all_blocks_free(timeout_s=60)
    record = _record(gateway_stack, request_id, orchestrator_pb2.REQUEST_STATE_CANCELLED)
    assert record.state == orchestrator_pb2.REQUEST_STATE_CANCELLED
    assert "CANCELLED" in [event.kind for event in record.events]


def test_the_websockets_streamed_input_is_recorded(gateway, gateway_stack):
    with connect(gateway.ws_url, open_timeout=30) as ws:
        request_id = json.loads(ws.recv(timeout=30))["id"]
        ws.send(json.dumps({"type": "session.update", "session": {"max_tokens": 4, "temperature": 0}}))
        for event in ({"type": "input.append", "text": "The capital of France"},
                      {"type": "input.replace", "text": "The capital of Italy"}, {"type": "input.commit"}):
            ws.send(json.dumps(event))
        while (event := json.loads(ws.recv(timeout=120)))["type"] != "done":
            pass
    record = _record(gateway_stack, request_id)
    assert record.streamed and record.answer == event["text"]
    assert record.stats.num_updates == 1


def test_the_records_are_in_redis_itself(client, served_model, gateway_stack):
    """Read with a store of its own from the stack's Redis: the record is there, not only in memory."""
    response = client.chat.completions.create(model=served_model, max_tokens=3, temperature=0,
                                              messages=[{"role": "user", "content": QUESTION}])
    _record(gateway_stack, response.id)
    assert gateway_stack.run(gateway_stack.orchestrator.service.store.flush(30))      # every write reached Redis

    async def read():
        async with LifecycleStore(gateway_stack.redis.url) as store:
            return await store.get(response.id)

    stored = gateway_stack.run(read())
    assert stored is not None and stored.state == "FINISHED" and stored.retriever == "none"
