"""The chaos soak against the compose stack (opt-in, like the rest of tests/compose):

    bash scripts/test.sh tests/compose/test_chaos_compose.py --run-compose

The same soak as `streamrag bench chaos` (load_tests.chaos.run.soak) on the compose project the
compose suite builds and starts (`running_stack` of test_compose_stack.py: its images, an API key,
mutual TLS on every service, the gateway on a free port), wired as `bench chaos` wires the local
stack it starts: two replicas in float32 (docker-compose.fp32.yml here, so greedy answers compare
exactly), two orchestrators over one Redis, and the users asking as `streamrag ask` does: one
channel over both orchestrators (round_robin with health checking), a broken Ask re-issued as a
resume. For that the orchestrators' ports are published on the host's loopback
(docker-compose.chaos.yml here, on free ports), and the users dial them with the suite's `client`
certificate and the key. A session ingests meanwhile, and every 60 s one container is hurt in
turn (faults.DEFAULT_TARGETS, as `bench chaos`): inference-0, anns, crawler, the orchestrator and
Redis are killed (SIGKILL of the container's main process: a crash, which `restart:
unless-stopped` answers), then each frozen for 10 s (`docker kill -s STOP`, then `-s CONT`); the
other orchestrator takes the asks over. Replica stats for the leak check are read inside each
replica's container over its own TLS files. It asserts the behavioural targets (those of the local
soak, tests/test_chaos.py); the timings are printed, not asserted.
"""

from __future__ import annotations

import json

import pytest

from load_tests.chaos.faults import DEFAULT_TARGETS
from load_tests.chaos.run import SoakOptions, soak
from load_tests.chaos.stacks import ComposeStack
from servicekit.tls import TlsFiles
from tests.compose.test_compose_resume import FP32, ORCHESTRATORS
from tests.compose.test_compose_stack import PROJECT, ROOT, free_port, running_stack

pytestmark = pytest.mark.compose

CHAOS = "tests/compose/docker-compose.chaos.yml"
# The variable docker-compose.chaos.yml publishes each orchestrator's port with.
PORT_VARIABLES = {"orchestrator": "STREAMRAG_CHAOS_ORCHESTRATOR_PORT",
                  "orchestrator-1": "STREAMRAG_CHAOS_ORCHESTRATOR_1_PORT"}


@pytest.fixture(scope="module")
def stack(request):
    """The suite's stack with fp32 replicas and both orchestrators published on the host's loopback;
    `orchestrators` is their addresses ("127.0.0.1:p,127.0.0.1:q")."""
    ports: dict[str, int] = {}
    while len(set(ports.values())) < len(ORCHESTRATORS):
        ports = {name: free_port() for name in ORCHESTRATORS}
    env = {PORT_VARIABLES[name]: str(port) for name, port in ports.items()}
    with running_stack(request, overrides=(FP32, CHAOS), env=env) as s:
        s.orchestrators = ",".join(f"127.0.0.1:{ports[name]}" for name in ORCHESTRATORS)
        yield s


@pytest.mark.timeout(3600)
def test_a_soak_with_every_service_killed_then_frozen_meets_the_behavioural_targets(stack):
    client = TlsFiles(stack.certs / "client.crt", stack.certs / "client.key", stack.ca)
    chaos_stack = ComposeStack(stack.compose, PROJECT, [ROOT / f for f in stack.files], stack.orchestrators, ROOT,
                               stack.env, key=stack.key, tls=client, dtype="float32")
    report = soak(chaos_stack, SoakOptions(duration_s=600, users=4, fault_every_s=60, stop_s=10, questions=4,
                                           max_tokens=16, deadline_s=180, recover_timeout_s=600),
                  {"stack": "compose", "replicas": len(chaos_stack.replicas)})
    print("chaos soak on compose:", json.dumps({"totals": report["totals"], "faults": report["faults"]}, indent=1))
    totals, rows = report["totals"], report["faults"]

    faults = [(r["action"], r["target"]) for r in rows]
    assert faults == [(action, target) for action in ("kill", "stop") for target in DEFAULT_TARGETS], faults
    assert report["settings"]["orchestrators"] == 2
    assert all(not r["error"] and r["down_s"] is not None for r in rows), rows     # each came back healthy
    assert totals["answered"] > 0 and report["answers"]["compared"] > 0
    assert totals["hung"] == 0, rows
    assert totals["failures_outside_windows"] == 0, report["outside_windows"]
    assert totals["leaked_blocks"] == 0, report["leaked"]
    assert totals["lost_events"] == 0, report["lost"]
    assert report["answers"]["differ"] == 0, report["answers"]["examples"]
    assert totals["crossed_differ"] == 0 and totals["out_of_order"] == 0, rows
    killed = rows[faults.index(("kill", "orchestrator"))]
    assert killed["failed"] == 0, killed             # the other orchestrator takes the asks over
