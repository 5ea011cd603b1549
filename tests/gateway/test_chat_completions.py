"""`POST /v1/chat/completions` with the official `openai` client: plain chats on the served model."""

from __future__ import annotations

import uuid

from gateway.chat_prompt import chat_segments
from protos import inference_pb2
from tests.support.inference_calls import collect

QUESTION = "What is the capital of France?"


def test_a_plain_chat_answers_with_usage_and_a_finish_reason(client, served_model):
    response = client.chat.completions.create(model=served_model, max_tokens=8,
                                              messages=[{"role": "user", "content": QUESTION}])
    choice = response.choices[0]
    assert response.object == "chat.completion" and response.model == served_model
    assert choice.message.role == "assistant" and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert response.usage.completion_tokens >= 1 and response.usage.prompt_tokens > 10
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_greedy_chat_equals_generate_on_the_same_segments(client, served_model, gateway_stack):
    """The gateway's prompt is the model's chat format, segment by segment: Generate on the same
    segments gives the very same greedy text."""
    messages = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}]
    response = client.chat.completions.create(model=served_model, max_tokens=6, temperature=0, messages=messages)
    stub = gateway_stack.inference.stub
    chat = stub.Describe(inference_pb2.DescribeRequest(), timeout=30).model_info.chat_format
    segments = chat_segments(chat, [(m["role"], m["content"]) for m in messages])
    expected = collect(stub.Generate(inference_pb2.GenerateRequest(
        request_id=uuid.uuid4().hex, segments=segments, sampling={"max_tokens": 6}), timeout=120))
    assert response.choices[0].message.content == expected.done.text


def test_a_streamed_chat_opens_with_the_role_and_ends_with_usage(client, served_model):
    stream = client.chat.completions.create(model=served_model, max_completion_tokens=5, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": QUESTION}])
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]                      # 5 tokens are not a whole answer
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert text and all(c.object == "chat.completion.chunk" for c in chunks)


def test_a_stop_string_ends_the_answer_before_it(client, served_model):
    ask = {"model": served_model, "max_tokens": 12, "messages": [{"role": "user", "content": QUESTION}]}
    full = client.chat.completions.create(**ask).choices[0].message.content
    stop = full.split()[1]                              # a word in the middle of the greedy answer
    stopped = client.chat.completions.create(**ask, stop=[stop]).choices[0]
    assert stopped.finish_reason == "stop" and stop not in stopped.message.content
    assert full.startswith(stopped.message.content)


def test_the_same_seed_samples_the_same_answer(client, served_model):
    ask = {"model": served_model, "max_tokens": 10, "temperature": 1.0, "top_p": 0.95,
           "messages": [{"role": "user", "content": "Tell me something about the sea."}]}
    first, second = (client.chat.completions.create(**ask, seed=1234).choices[0].message.content for _ in range(2))
    assert first == second
