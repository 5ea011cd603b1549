"""RAG through the gateway: model `streamrag-rag` or the `retrieval` body field runs
`Orchestrator.Ask`; the sources come back in the final chunk's `streamrag` field, and the request
is in the Redis lifecycle store like every Ask."""

from __future__ import annotations

import openai
import pytest

from gateway.protocol import RAG_MODEL
from protos import orchestrator_pb2

QUESTION = "How do I read a file?"


def test_streamrag_rag_answers_with_sources_in_the_final_chunk(client, gateway_stack):
    stream = client.chat.completions.create(model=RAG_MODEL, max_tokens=8, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": QUESTION}])
    chunks = list(stream)
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    extension = final.model_extra["streamrag"]
    assert extension["sources"] and all(s["source"] == "anns" for s in extension["sources"])
    assert any("Files" in s["title"] for s in extension["sources"])
    assert chunks[-1].usage.prompt_tokens > 100          # the retrieved documents are in the prompt
    record = gateway_stack.stub.GetRequest(orchestrator_pb2.GetRequestRequest(
        request_id=extension["request_id"]), timeout=30).record
    assert record.state == orchestrator_pb2.REQUEST_STATE_FINISHED and record.question == QUESTION
    assert extension["request_id"] == final.id            # the response id is the stored request's id


def test_a_retrieval_field_on_the_served_model_asks_the_crawler(client, served_model):
    response = client.chat.completions.create(model=served_model, max_tokens=8,
                                              messages=[{"role": "user", "content": QUESTION}],
                                              extra_body={"retrieval": {"retriever": "crawler"}})
    sources = response.model_extra["streamrag"]["sources"]
    assert sources and {s["source"] for s in sources} == {"crawler"}
    assert response.choices[0].message.content


def test_a_completion_on_streamrag_rag_asks_its_prompt(client):
    response = client.completions.create(model=RAG_MODEL, prompt=QUESTION, max_tokens=6,
                                         extra_body={"retrieval": {"retriever": "anns", "top_k": 2}})
    assert len(response.model_extra["streamrag"]["sources"]) == 2
    assert response.usage.completion_tokens >= 1


def test_a_collection_the_retriever_does_not_search_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=RAG_MODEL, max_tokens=4, messages=[{"role": "user", "content": QUESTION}],
                                       extra_body={"retrieval": {"retriever": "crawler", "collection": "mine"}})
    assert "collection" in caught.value.body["message"]
