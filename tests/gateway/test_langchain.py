"""LangChain's `ChatOpenAI` (langchain-openai) works against the gateway unchanged."""

from __future__ import annotations

import pytest

langchain_openai = pytest.importorskip("langchain_openai")


def test_chat_openai_invokes_and_streams(gateway, served_model):
    llm = langchain_openai.ChatOpenAI(base_url=f"{gateway.base_url}/v1", api_key="not-needed", model=served_model,
                                      max_tokens=6, temperature=0, max_retries=0, timeout=120)
    answer = llm.invoke("What is the capital of France?")
    assert "Paris" in answer.content
    streamed = "".join(chunk.content for chunk in llm.stream("What is the capital of France?"))
    assert streamed == answer.content
