"""`/v1/realtime`: streaming input over a WebSocket onto one `Inference.StreamPrompt`."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from websockets.exceptions import ConnectionClosedError
from websockets.sync.client import connect

from gateway.chat_prompt import head_segments, suffix_segments, text_segments
from protos import inference_pb2
from tests.support.inference_calls import collect


def converse(url: str, events: list[dict], *, gap_s: float = 0.0, headers: dict | None = None) -> list[dict]:
    """Send `events` (pausing `gap_s` between them) and return every server event until it closes."""
    received = []
    with connect(url, additional_headers=headers, open_timeout=30) as ws:
        received.append(json.loads(ws.recv(timeout=30)))
        for event in events:
            ws.send(event if isinstance(event, bytes | str) else json.dumps(event))   # str/bytes: sent as they are
            time.sleep(gap_s)
        try:
            for message in ws:
                received.append(json.loads(message))
        except ConnectionClosedError as exc:
            received.append({"type": "closed", "code": exc.rcvd.code if exc.rcvd else None})
    return received


def test_appends_and_a_replace_give_generates_tokens_for_the_same_final_prompt(gateway, gateway_stack):
    events = [
        {"type": "session.update", "session": {"max_tokens": 10, "temperature": 0}},
        {"type": "input.append", "text": "The capital of Spain is Madrid."},
        {"type": "input.append", "text": " The capital of France"},
        # keeps the first segment (the new text still starts with it); the rest is one new segment
        {"type": "input.replace", "text": "The capital of Spain is Madrid. The capital of Italy"},
        {"type": "input.append", "text": " is"},
        {"type": "input.commit"},
    ]
    received = converse(gateway.ws_url, events, gap_s=0.2)
    assert received[0]["type"] == "session.created"
    tokens = [e for e in received if e["type"] == "token"]
    done = received[-1]
    assert done["type"] == "done" and done["finish_reason"] in ("stop", "length")
    assert done["stats"]["num_appends"] == 3 and done["stats"]["num_updates"] == 1
    assert {e["kind"] for e in received if e["type"] == "lifecycle"} >= {"QUEUED", "FIRST_TOKEN", "FINISHED"}

    stub = gateway_stack.inference.stub
    chat = stub.Describe(inference_pb2.DescribeRequest(), timeout=30).model_info.chat_format
    segments = [*head_segments(chat), *text_segments(["The capital of Spain is Madrid.", " The capital of Italy",
                                                      " is"]), *suffix_segments(chat)]
    expected = collect(stub.Generate(inference_pb2.GenerateRequest(
        request_id=uuid.uuid4().hex, segments=segments, sampling={"max_tokens": 10}), timeout=120))
    assert [t["id"] for t in tokens] == expected.tokens
    assert done["text"] == expected.done.text
    assert done["stats"]["prompt_tokens"] == expected.done.stats.prompt_tokens
    assert done["usage"]["completion_tokens"] == len(tokens)


def test_raw_input_is_sent_without_the_chat_format(gateway, gateway_stack):
    events = [{"type": "session.update", "session": {"chat": False, "max_tokens": 4}},
              {"type": "input.append", "text": "The capital of France is"}, {"type": "input.commit"}]
    done = converse(gateway.ws_url, events)[-1]
    expected = collect(gateway_stack.inference.stub.Generate(inference_pb2.GenerateRequest(
        request_id=uuid.uuid4().hex, segments=text_segments(["The capital of France is"]),
        sampling={"max_tokens": 4}), timeout=120))
    assert done["text"] == expected.done.text and done["stats"]["prompt_tokens"] == expected.done.stats.prompt_tokens


@pytest.mark.parametrize(("events", "message"), [
    ([{"type": "input.shout", "text": "x"}], "input.shout"),
    ([b"\x00binary"], "text frames"),
    (["not json"], "JSON"),
    ([{"type": "input.append", "text": "hi"}, {"type": "session.update", "session": {}}], "before the first input"),
    ([{"type": "session.update", "session": {"temperature": 9}}], "temperature"),
    ([{"type": "session.update", "session": {"model": "no-such-model"}}, {"type": "input.append", "text": "x"}],
     "does not exist"),
], ids=["unknown-type", "binary", "not-json", "late-session-update", "bad-temperature", "unknown-model"])
def test_a_bad_event_gets_an_error_event_and_a_close(gateway, events, message):
    received = converse(gateway.ws_url, events)
    errors = [e for e in received if e["type"] == "error"]
    assert len(errors) == 1 and message in errors[0]["error"]["message"]
    assert errors[0]["status"] in (400, 404)
    assert received[-1] == {"type": "closed", "code": 1008}
