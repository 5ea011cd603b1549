"""Bad input gets a clear 4xx with the OpenAI error body, never a 500."""

from __future__ import annotations

import httpx
import pytest

from gateway.protocol import RAG_MODEL

SERVED = "<served>"      # replaced by the served model's name
CHAT = {"model": SERVED, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}


def chat(**changes):
    return {**CHAT, **changes}


CASES = {
    "unknown-model": ("chat/completions", chat(model="gpt-4o"), 404, "does not exist"),
    "n-2": ("chat/completions", chat(n=2), 400, "n=1"),
    "tools": ("chat/completions", chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    "tool-choice": ("chat/completions", chat(tool_choice="auto"), 400, "tools"),
    "json-mode": ("chat/completions", chat(response_format={"type": "json_object"}), 400, "response_format"),
    "logprobs": ("chat/completions", chat(logprobs=True), 400, "logprobs"),
    "penalty": ("chat/completions", chat(presence_penalty=0.5), 400, "penalties"),
    "temperature": ("chat/completions", chat(temperature=2.5), 400, "temperature"),
    "temperature-nan": ("chat/completions", chat(temperature="nan"), 400, "temperature"),
    "top-p-zero": ("chat/completions", chat(top_p=0), 400, "top_p"),
    "negative-seed": ("chat/completions", chat(seed=-1), 400, "seed"),
    "max-tokens-zero": ("chat/completions", chat(max_tokens=0), 400, "max_tokens"),
    "too-many-stops": ("chat/completions", chat(stop=[f"s{i}" for i in range(17)]), 400, "stop"),
    "empty-stop": ("chat/completions", chat(stop=""), 400, "stop"),
    "no-messages": ("chat/completions", chat(messages=[]), 400, "messages"),
    "image": ("chat/completions", chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400, "only text"),
    "tool-role": ("chat/completions", chat(messages=[{"role": "tool", "content": "x"}]), 400, "role"),
    "assistant-last": ("chat/completions", chat(messages=[{"role": "assistant", "content": "x"}]), 400, "last message"),
    "stream-options-without-stream": ("chat/completions", chat(stream_options={"include_usage": True}), 400,
                                      "stream_options"),
    "unknown-retriever": ("chat/completions", chat(retrieval={"retriever": "google"}), 400, "retriever"),
    "retrieval-extra-field": ("chat/completions", chat(retrieval={"depth": 3}), 400, "depth"),
    "rag-max-tokens": ("chat/completions", chat(model=RAG_MODEL, max_tokens=5000), 400, "max_tokens"),
    "missing-model": ("completions", {"prompt": "x"}, 400, "model"),
    "two-prompts": ("completions", {"model": SERVED, "prompt": ["a", "b"]}, 400, "one prompt"),
    "echo": ("completions", {"model": SERVED, "prompt": "a", "echo": True}, 400, "echo"),
    "negative-token-id": ("completions", {"model": SERVED, "prompt": [1, -2]}, 400, "token ids"),
    "token-id-outside-vocabulary": ("completions", {"model": SERVED, "prompt": [10**8], "max_tokens": 1}, 400,
                                    "INVALID_ARGUMENT"),
    "prompt-too-long": ("completions", {"model": SERVED, "prompt": "hello " * 9000, "max_tokens": 1}, 400,
                        "prompt too long"),
    "not-an-object": ("completions", [1, 2, 3], 400, "dictionary"),
}


def _post(gateway, path: str, served_model: str, body) -> httpx.Response:
    if isinstance(body, dict):
        body = {k: served_model if v == SERVED else v for k, v in body.items()}
    return httpx.post(f"{gateway.base_url}/v1/{path}", json=body, timeout=120)


def assert_error(response: httpx.Response, status: int, fragment: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"], error
    return error


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_a_4xx_with_the_error_body(gateway, served_model, case):
    path, body, status, fragment = CASES[case]
    assert_error(_post(gateway, path, served_model, body), status, fragment)


def test_malformed_json_is_a_400(gateway):
    response = httpx.post(f"{gateway.base_url}/v1/chat/completions", content=b'{"model": "x", "messages": [',
                          headers={"content-type": "application/json"}, timeout=30)
    assert assert_error(response, 400, "malformed JSON")["code"] == "invalid_json"


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_body_over_a_mebibyte_is_a_413(gateway, declared):
    body = b'{"model": "' + b"x" * (1024 * 1024) + b'"}'
    content = body if declared else iter([body[:1000], body[1000:]])
    response = httpx.post(f"{gateway.base_url}/v1/chat/completions", content=content,
                          headers={"content-type": "application/json"}, timeout=30)
    assert_error(response, 413, "larger than")


def test_unknown_paths_and_methods_get_the_error_body(gateway):
    assert_error(httpx.get(f"{gateway.base_url}/v1/engines", timeout=30), 404, "Not Found")
    assert_error(httpx.get(f"{gateway.base_url}/v1/chat/completions", timeout=30), 405, "Method Not Allowed")
    assert_error(httpx.get(f"{gateway.base_url}/v1/models/gpt-4o", timeout=30), 404, "does not exist")
