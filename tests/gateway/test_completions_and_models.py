"""`POST /v1/completions`, `GET /v1/models` and the metrics endpoint."""

from __future__ import annotations

import httpx

from gateway.protocol import RAG_MODEL


def test_models_lists_the_rag_model_and_the_served_model(client, served_model):
    ids = [model.id for model in client.models.list()]
    assert ids == [RAG_MODEL, served_model]
    assert client.models.retrieve(served_model).id == served_model


def test_a_completion_continues_raw_text(client, served_model):
    response = client.completions.create(model=served_model, prompt="The capital of France is", max_tokens=4)
    assert response.object == "text_completion" and response.choices[0].text
    assert response.usage.completion_tokens == 4 and response.choices[0].finish_reason == "length"


def test_a_streamed_completion_gives_the_same_greedy_text(client, served_model):
    ask = {"model": served_model, "prompt": "Water boils at", "max_tokens": 6}
    whole = client.completions.create(**ask).choices[0].text
    chunks = list(client.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens == 6


def test_a_prompt_of_token_ids_is_used_as_is(client, served_model):
    ids = client.completions.create(model=served_model, prompt=[504, 3575, 282, 4649, 314], max_tokens=3)
    assert ids.usage.prompt_tokens == 5


def test_metrics_count_requests_by_route_and_status(client, gateway, served_model):
    client.completions.create(model=served_model, prompt="Hello", max_tokens=1)
    text = httpx.get(f"{gateway.base_url}/metrics").text
    assert 'streamrag_gateway_requests_total{route="/v1/completions",status="200"}' in text
    assert 'streamrag_gateway_ttft_seconds_count{kind="plain",route="/v1/completions"}' in text
