"""One tenant's limits hold across the fleet: two gateways, each in front of its own orchestrator process,
over one Redis. Requests sent in turn through both gateways with the official `openai` client are admitted
up to the tenant's `requests_per_minute` in all, the rest refused 429 with `Retry-After` and OpenAI's
`x-ratelimit-*` headers by either gateway; a request in flight through one gateway holds the tenant's only
`max_concurrent` slot against the other."""

from __future__ import annotations

import math
import time
import uuid

import openai
import pytest

from gateway.app import GatewaySettings
from servicekit.tenants import parse_tenants
from tests.support.gateway import RunningGateway
from tests.support.orchestrator import OrchestratorProcess

STACK_KEY = "sk-fleet-stack-own"
RPM = 6
RUN = uuid.uuid4().hex[:8]            # tenant names unique to this run: the stack's Redis outlives a module
TENANTS = f"""
[tenants.fleet-rpm-{RUN}]
keys = ["fleet-rpm-key"]
requests_per_minute = {RPM}

[tenants.fleet-conc-{RUN}]
keys = ["fleet-conc-key"]
max_concurrent = 1
"""


@pytest.fixture(scope="module")
def fleet(gateway_stack, tmp_path_factory):
    """Two gateways, the first in front of the first orchestrator process, the second of the second."""
    root = tmp_path_factory.mktemp("fleet")
    (root / "tenants.toml").write_text(TENANTS)
    tenants = parse_tenants(TENANTS, own_keys=[STACK_KEY])
    started: list = []
    try:
        for i in range(2):
            orchestrator = OrchestratorProcess(gateway_stack.redis.url, [gateway_stack.inference.address],
                                               log_path=root / f"orchestrator-{i}.log",
                                               args=("--tenants", str(root / "tenants.toml")),
                                               env={"STREAMRAG_API_KEY": STACK_KEY})
            started.append(orchestrator)
            started.append(RunningGateway(GatewaySettings(orchestrator=orchestrator.address,
                                                          api_keys=tenants.keys, tenants=tenants)))
        yield started[1], started[3]
    finally:
        for part in reversed(started):
            part.stop()


def _clients(fleet, key: str) -> list[openai.OpenAI]:
    return [openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0, timeout=120)
            for gateway in fleet]


def _complete(client: openai.OpenAI, model: str):
    return client.completions.create(model=model, prompt="Hi", max_tokens=1)


def test_two_gateways_and_two_orchestrators_enforce_one_requests_per_minute_limit(fleet, served_model):
    clients = _clients(fleet, "fleet-rpm-key")
    admitted, refused = [0, 0], [[], []]
    started = time.monotonic()
    for i in range(2 * RPM + 2):                       # in turn through the two gateways
        try:
            _complete(clients[i % 2], served_model)
            admitted[i % 2] += 1
        except openai.RateLimitError as exc:
            assert exc.status_code == 429 and exc.type == "rate_limit_error", exc.body
            refused[i % 2].append(exc.response.headers)
    elapsed = time.monotonic() - started
    # the bucket starts full (RPM) and refills at RPM a minute: what it may have refilled while the requests
    # ran is allowed beside the RPM, nothing more (a bound from the limit, not a timing assert)
    refilled = math.floor(elapsed * RPM / 60)
    assert RPM <= sum(admitted) <= RPM + refilled, (admitted, elapsed)
    assert admitted[0] and admitted[1], admitted
    assert refused[0] and refused[1], "each gateway refuses once the shared limit is spent"
    for headers in refused[0] + refused[1]:
        assert int(headers["retry-after"]) >= 1
        assert headers["x-ratelimit-limit-requests"] == str(RPM)
        assert headers["x-ratelimit-remaining-requests"] == "0"
        reset = headers["x-ratelimit-reset-requests"]
        assert reset.endswith("s") and float(reset[:-1]) > 0


def test_a_request_in_flight_through_one_gateway_holds_max_concurrent_against_the_other(fleet, served_model):
    first, second = _clients(fleet, "fleet-conc-key")
    stream = first.chat.completions.create(model=served_model, messages=[{"role": "user", "content": "Count."}],
                                           max_tokens=24, stream=True)
    try:
        next(iter(stream))                             # running, through the first gateway and orchestrator
        with pytest.raises(openai.RateLimitError) as raised:
            _complete(second, served_model)
        headers = raised.value.response.headers
        assert raised.value.status_code == 429 and headers["x-ratelimit-limit-concurrent"] == "1"
        assert int(headers["retry-after"]) >= 1
    finally:
        stream.close()
    for _ in range(50):                                # its slot frees as the cancelled call ends (no clock)
        try:
            _complete(second, served_model)
            break
        except openai.RateLimitError:
            continue
    else:
        pytest.fail("the tenant's slot never freed after its request ended")
