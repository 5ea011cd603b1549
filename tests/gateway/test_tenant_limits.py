"""Tenants' limits, held in the stack's Redis: a tenant over `max_concurrent`, `requests_per_minute` or
`tokens_per_minute` gets 429 with `Retry-After` and OpenAI's `x-ratelimit-*` headers through the official
`openai` client, and RESOURCE_EXHAUSTED with the same values in trailing metadata over gRPC; an answer to a
limited tenant carries the values at admission too (initial metadata over gRPC), an unlimited tenant's
none; two tenants' counters are independent; the orchestrator refuses a priority that is not an integer."""

from __future__ import annotations

import threading
import uuid
from contextlib import contextmanager

import grpc
import httpx
import openai
import pytest

from gateway.app import GatewaySettings
from protos import inference_pb2, inference_pb2_grpc, orchestrator_pb2
from protos.metadata import PRIORITY_KEY, TENANT_KEY
from servicekit.auth import bearer_metadata
from servicekit.tenants import parse_tenants
from tests.support.gateway import RunningGateway

STACK_KEY = "sk-stack-own"
RUN = uuid.uuid4().hex[:8]            # tenant names unique to this run: the stack's Redis outlives a module
TENANTS = f"""
[tenants.rpm-{RUN}]
keys = ["rpm-key"]
requests_per_minute = 2

[tenants.other-{RUN}]
keys = ["other-key"]
requests_per_minute = 2

[tenants.conc-{RUN}]
keys = ["conc-key"]
max_concurrent = 1

[tenants.tpm-{RUN}]
keys = ["tpm-key"]
tokens_per_minute = 5

[tenants.grpc-{RUN}]
keys = ["grpc-key"]
requests_per_minute = 1

[tenants.queue-{RUN}]
keys = ["queue-key"]
max_queue_s = 1

[tenants.headers-{RUN}]
keys = ["headers-key"]
requests_per_minute = 10
tokens_per_minute = 100000

[tenants.free-{RUN}]
keys = ["free-key"]
"""


@pytest.fixture(scope="module")
def limited(gateway_stack):
    tenants = parse_tenants(TENANTS, own_keys=[STACK_KEY])
    orchestrator = gateway_stack.orchestrate(tenants=tenants)
    gateway = None
    try:
        gateway = RunningGateway(GatewaySettings(orchestrator=orchestrator.address, api_keys=tenants.keys,
                                                 tenants=tenants))
        yield gateway, orchestrator
    finally:
        if gateway is not None:
            gateway.stop()
        orchestrator.stop()


def _client(limited, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{limited[0].base_url}/v1", api_key=key, max_retries=0, timeout=120)


def _complete(client: openai.OpenAI, model: str, **extra):
    return client.completions.create(model=model, prompt="The capital of France is", max_tokens=2, **extra)


def _refused(call) -> httpx.Response:
    with pytest.raises(openai.RateLimitError) as raised:
        call()
    body = raised.value.body
    assert raised.value.status_code == 429 and raised.value.type == "rate_limit_error", body
    return raised.value.response


def test_a_tenant_over_its_requests_per_minute_gets_429_with_openais_headers(limited, served_model):
    client = _client(limited, "rpm-key")
    _complete(client, served_model)
    _complete(client, served_model)
    headers = _refused(lambda: _complete(client, served_model)).headers
    assert int(headers["retry-after"]) >= 1
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s") and float(headers["x-ratelimit-reset-requests"][:-1]) > 0
    # the other tenant's counter is its own: it still has both of its requests
    other = _client(limited, "other-key")
    _complete(other, served_model)
    _complete(other, served_model)
    _refused(lambda: _complete(other, served_model))


def test_a_tenant_at_its_max_concurrent_gets_429_until_its_request_ends(limited, served_model):
    client = _client(limited, "conc-key")
    stream = client.chat.completions.create(model=served_model, messages=[{"role": "user", "content": "Count."}],
                                            max_tokens=24, stream=True)
    try:
        next(iter(stream))                   # the first request is running
        headers = _refused(lambda: _complete(client, served_model)).headers
        assert headers["x-ratelimit-limit-concurrent"] == "1" and int(headers["retry-after"]) >= 1
    finally:
        stream.close()
    for _ in range(50):                      # its slot frees as the cancelled call ends (no clock asserted)
        try:
            _complete(client, served_model)
            break
        except openai.RateLimitError:
            continue
    else:
        pytest.fail("the tenant's slot never freed after its request ended")


def test_a_tenant_over_its_tokens_per_minute_gets_429_with_the_token_headers(limited, served_model):
    client = _client(limited, "tpm-key")
    done = _complete(client, served_model)            # admitted with 5 tokens left; costs more than 5
    assert done.usage.total_tokens > 5
    headers = _refused(lambda: _complete(client, served_model)).headers
    assert headers["x-ratelimit-limit-tokens"] == "5"
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert int(headers["retry-after"]) >= 1 and "x-ratelimit-limit-requests" not in headers


def test_over_grpc_a_limit_is_resource_exhausted_with_the_retry_delay_in_trailing_metadata(limited, served_model):
    orchestrator = limited[1]
    stub = inference_pb2_grpc.InferenceStub(orchestrator.channel)
    request = inference_pb2.GenerateRequest(segments=[{"text": "Hello"}], sampling={"max_tokens": 2})
    list(stub.Generate(request, timeout=120, metadata=bearer_metadata("grpc-key")))
    with pytest.raises(grpc.RpcError) as raised:
        list(stub.Generate(request, timeout=120, metadata=bearer_metadata("grpc-key")))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "requests_per_minute" in raised.value.details()
    trailing = dict(raised.value.trailing_metadata())
    assert int(trailing["retry-after"]) >= 1 and trailing["x-ratelimit-limit-requests"] == "1"
    # an Ask counts against the same limit
    with pytest.raises(grpc.RpcError) as raised:
        list(orchestrator.stub.Ask(orchestrator_pb2.AskRequest(question="files?", max_tokens=2), timeout=120,
                                   metadata=bearer_metadata("grpc-key")))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_limited_tenants_answers_carry_openais_rate_limit_headers_and_an_unlimited_tenants_none(
        limited, served_model):
    client = _client(limited, "headers-key")
    messages = [{"role": "user", "content": "Hi"}]
    raw = client.chat.completions.with_raw_response.create(model=served_model, messages=messages, max_tokens=2)
    assert raw.parse().choices[0].message.content is not None
    first = raw.headers
    assert first["x-ratelimit-limit-requests"] == "10" and first["x-ratelimit-remaining-requests"] == "9"
    assert first["x-ratelimit-limit-tokens"] == "100000" and first["x-ratelimit-remaining-tokens"] == "100000"
    for kind in ("requests", "tokens"):
        reset = first[f"x-ratelimit-reset-{kind}"]
        assert reset.endswith("s") and float(reset[:-1]) >= 0
    assert "retry-after" not in first and "x-ratelimit-limit-concurrent" not in first
    # streamed: the headers leave first, with the values at admission
    with client.chat.completions.with_streaming_response.create(model=served_model, messages=messages,
                                                                max_tokens=2, stream=True) as streamed:
        headers = streamed.headers
        assert any(chunk.choices for chunk in streamed.parse())
    assert headers["x-ratelimit-limit-requests"] == "10" and int(headers["x-ratelimit-remaining-requests"]) < 10
    assert 0 <= int(headers["x-ratelimit-remaining-tokens"]) <= 100000   # (buckets refill: no exact count asserted)
    completion = client.completions.with_raw_response.create(model=served_model, prompt="Hi", max_tokens=1)
    assert completion.headers["x-ratelimit-limit-tokens"] == "100000"
    free = _client(limited, "free-key").chat.completions.with_raw_response.create(
        model=served_model, messages=messages, max_tokens=2)
    assert not [key for key in free.headers if key.lower().startswith("x-ratelimit-")]
    # over gRPC: the initial metadata of the admitted call
    stub = inference_pb2_grpc.InferenceStub(limited[1].channel)
    call = stub.Generate(inference_pb2.GenerateRequest(segments=[{"text": "Hi"}], sampling={"max_tokens": 1}),
                         timeout=120, metadata=bearer_metadata("headers-key"))
    initial = dict(call.initial_metadata())
    list(call)
    assert initial["x-ratelimit-limit-requests"] == "10" and int(initial["x-ratelimit-remaining-requests"]) < 10


def test_only_the_stacks_own_key_may_name_the_tenant_a_call_is_for(limited, served_model):
    stub = inference_pb2_grpc.InferenceStub(limited[1].channel)
    request = inference_pb2.GenerateRequest(segments=[{"text": "Hi"}], sampling={"max_tokens": 1})
    # "other-key" naming the exhausted rpm tenant is still "other" (exhausted too by the first test), while the
    # stack's key naming a fresh tenant is that tenant: both shown by whose counter refuses
    with pytest.raises(grpc.RpcError) as raised:
        list(stub.Generate(request, timeout=120, metadata=(*bearer_metadata("other-key"), (TENANT_KEY, "nobody"))))
    assert f"other-{RUN}" in raised.value.details()
    with pytest.raises(grpc.RpcError) as raised:
        list(stub.Generate(request, timeout=120, metadata=(*bearer_metadata(STACK_KEY), (TENANT_KEY, f"rpm-{RUN}"))))
    assert f"rpm-{RUN}" in raised.value.details()


def test_a_priority_that_is_not_an_integer_is_refused(limited, served_model):
    response = httpx.post(f"{limited[0].base_url}/v1/completions", headers={
        "Authorization": "Bearer conc-key", "x-request-priority": "high"},
        json={"model": served_model, "prompt": "Hi", "max_tokens": 1}, timeout=60)
    assert response.status_code == 400 and "x-request-priority" in response.json()["error"]["message"]
    response = httpx.post(f"{limited[0].base_url}/v1/completions", headers={"Authorization": "Bearer conc-key"},
                          json={"model": served_model, "prompt": "Hi", "max_tokens": 1, "priority": 1.5}, timeout=60)
    assert response.status_code == 400 and "priority" in response.json()["error"]["message"]
    stub = inference_pb2_grpc.InferenceStub(limited[1].channel)
    request = inference_pb2.GenerateRequest(segments=[{"text": "Hi"}], sampling={"max_tokens": 1})
    with pytest.raises(grpc.RpcError) as raised:
        list(stub.Generate(request, timeout=60, metadata=(*bearer_metadata("conc-key"), (PRIORITY_KEY, "x"))))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_tenant_and_priority_are_recorded_with_the_request_and_filter_the_list(limited, served_model):
    client = _client(limited, "conc-key")
    completion = _complete(client, served_model, extra_headers={"x-request-priority": "3"})
    orchestrator = limited[1]
    record = orchestrator.stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=completion.id),
                                          timeout=30, metadata=bearer_metadata(STACK_KEY)).record
    assert (record.tenant, record.priority) == (f"conc-{RUN}", 3)
    chat = client.chat.completions.create(model=served_model, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=1, extra_body={"priority": -2})
    record = orchestrator.stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=chat.id), timeout=30,
                                          metadata=bearer_metadata(STACK_KEY)).record
    assert (record.tenant, record.priority) == (f"conc-{RUN}", -2)
    listed = orchestrator.stub.ListRequests(orchestrator_pb2.ListRequestsRequest(limit=50, tenant=f"conc-{RUN}"),
                                            timeout=30, metadata=bearer_metadata(STACK_KEY)).records
    assert {completion.id, chat.id} <= {r.request_id for r in listed}
    assert {r.tenant for r in listed} == {f"conc-{RUN}"}


@contextmanager
def engine_held(gateway_stack):
    """The replica's engine thread waits (nothing starts, nothing steps) until the block ends."""
    release = threading.Event()
    gateway_stack.inference.service.thread.post(lambda engine: release.wait(300))
    try:
        yield
    finally:
        release.set()


def test_a_request_that_cannot_start_within_max_queue_s_gets_503_with_retry_after(limited, gateway_stack,
                                                                                  served_model):
    client = _client(limited, "queue-key")
    with engine_held(gateway_stack):
        with pytest.raises(openai.InternalServerError) as raised:
            _complete(client, served_model)
        assert raised.value.status_code == 503 and int(raised.value.response.headers["retry-after"]) >= 1
        assert "max_queue_s" in raised.value.message
        health = httpx.get(f"{limited[0].base_url}/health", timeout=30).json()
        assert health["saturated"] is True
        # over gRPC: UNAVAILABLE with the reason and the retry delay
        stub = inference_pb2_grpc.InferenceStub(limited[1].channel)
        request = inference_pb2.GenerateRequest(segments=[{"text": "Hi"}], sampling={"max_tokens": 1})
        with pytest.raises(grpc.RpcError) as shed:
            list(stub.Generate(request, timeout=120, metadata=bearer_metadata("queue-key")))
        assert shed.value.code() == grpc.StatusCode.UNAVAILABLE and "max_queue_s" in shed.value.details()
        assert int(dict(shed.value.trailing_metadata())["retry-after"]) >= 1
    gateway_stack.inference.wait_until_all_blocks_free()
    assert _complete(client, served_model).choices[0].text is not None     # it serves again


def test_a_stream_in_progress_is_never_shed(limited, gateway_stack, served_model):
    client = _client(limited, "queue-key")
    stream = client.chat.completions.create(model=served_model, messages=[{"role": "user", "content": "Count."}],
                                            max_tokens=12, stream=True)
    chunks = iter(stream)
    first = next(chunks)                       # streaming: it has started
    with engine_held(gateway_stack):
        threading.Event().wait(3)              # past its tenant's max_queue_s (1 s) while it cannot step
    rest = list(chunks)
    assert first.choices[0].delta.role == "assistant"
    assert rest[-1].choices[0].finish_reason in ("length", "stop")
