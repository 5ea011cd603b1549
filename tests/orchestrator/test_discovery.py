"""Replicas found by DNS (orchestrator/discovery.py): a real DNS server on loopback whose A records
the test changes, real replicas on 127.0.0.2 and 127.0.0.3, one orchestrator that is never restarted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import grpc
import pytest

from orchestrator import discovery as discovery_module
from orchestrator.discovery import DnsTarget, ReplicaDiscovery, split_targets
from orchestrator.prompt import preamble_key
from orchestrator.router import NoReplicaAvailable, ReplicaRouter
from protos import common_pb2, orchestrator_pb2
from tests.support.dns_server import DnsServer
from tests.support.inference import RunningInference
from tests.support.orchestrator import RunningOrchestrator
from tests.support.redis_server import PrivateRedis

NAME = "inference.streamrag.test"
HOSTS = ("127.0.0.2", "127.0.0.3")
NONE = orchestrator_pb2.RETRIEVER_CHOICE_NONE
LONG = 160      # tokens: the answer is still streaming when its replica is removed, then stopped


def ask(stub) -> orchestrator_pb2.AskDone:
    done = None
    for response in stub.Ask(orchestrator_pb2.AskRequest(question="What is the capital of France?", retriever=NONE,
                                                         max_tokens=4), timeout=120):
        if response.event.WhichOneof("kind") == "done":
            done = response.event.done
    assert done is not None
    return done


def port_free_on(hosts: tuple[str, ...]) -> int:
    """A port free on every one of `hosts` (each replica behind the name listens on the same port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every host")


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("text, target", [
    ("dns:///inference:50052", DnsTarget("dns:///inference:50052", "inference", 50052)),
    ("dns://10.0.0.10:5353/inference.ns.svc.cluster.local:50052",
     DnsTarget("dns://10.0.0.10:5353/inference.ns.svc.cluster.local:50052", "inference.ns.svc.cluster.local",
               50052, "10.0.0.10", 5353)),
    ("dns://10.0.0.10/inference:1", DnsTarget("dns://10.0.0.10/inference:1", "inference", 1, "10.0.0.10", 53)),
])
def test_targets_parse(text, target):
    assert DnsTarget.parse(text) == target
    assert split_targets(["127.0.0.1:50052", text]) == (["127.0.0.1:50052"], [target])


@pytest.mark.parametrize("text", ["dns:///inference", "dns:///inference:http", "dns:///:50052",
                                  "dns://:x/inference:50052", "dns:///inference:70000"])
def test_a_malformed_target_is_refused_with_its_form(text):
    with pytest.raises(ValueError, match=r"dns:///NAME:PORT|DNS server"):
        DnsTarget.parse(text)


def test_resolution_asks_the_given_server_and_the_system():
    with DnsServer() as dns:
        dns.set(NAME, ["127.0.0.3", "127.0.0.2"])
        assert asyncio.run(DnsTarget.parse(f"dns://127.0.0.1:{dns.port}/{NAME}:7").resolve()) == \
            ["127.0.0.2:7", "127.0.0.3:7"]
        assert asyncio.run(DnsTarget.parse(f"dns://127.0.0.1:{dns.port}/nothing.test:7").resolve()) == []
    assert asyncio.run(DnsTarget.parse("dns:///localhost:7").resolve()) != []   # getaddrinfo: /etc/hosts


def test_names_and_static_addresses_share_one_router_and_each_name_keeps_its_own(monkeypatch):
    """Prefill and decode pools behind two names, plus a static address one of them also gives."""
    with DnsServer() as dns:
        dns.set("prefill.test", ["127.0.0.2"])
        dns.set("decode.test", ["127.0.0.3", "127.0.0.1"])
        static, targets = split_targets(["127.0.0.1:7", f"dns://127.0.0.1:{dns.port}/prefill.test:7",
                                         f"dns://127.0.0.1:{dns.port}/decode.test:7"])
        router = ReplicaRouter(static)
        discovery = ReplicaDiscovery(router, targets, static)
        routed = lambda: {r.address for r in router.replicas}  # noqa: E731
        asyncio.run(discovery.resolve_all())
        assert routed() == {"127.0.0.1:7", "127.0.0.2:7", "127.0.0.3:7"}
        assert discovery.channel_options("127.0.0.2:7") == (("grpc.default_authority", "prefill.test:7"),)
        dns.set("decode.test", ["127.0.0.3"])
        asyncio.run(discovery.resolve_all())
        assert routed() == {"127.0.0.1:7", "127.0.0.2:7", "127.0.0.3:7"}     # the static one stays
        dns.set("decode.test", [])
        asyncio.run(discovery.resolve_all())
        assert routed() == {"127.0.0.1:7", "127.0.0.2:7"}
        assert router.replica("127.0.0.3:7").unavailable.startswith("no longer in DNS")
        assert router.notes == {targets[1].text: "decode.test resolves to no address"}
        with pytest.raises(NoReplicaAvailable, match=r"decode\.test resolves to no address"):
            router.choose("key")

        monkeypatch.setattr(discovery_module, "RETIRED_KEEP_S", 0.1)

        async def retire_then_forget() -> None:
            dns.set("prefill.test", [])
            await discovery.resolve_all()
            assert router.replica("127.0.0.2:7").unavailable.startswith("no longer in DNS")   # retired, kept
            await asyncio.sleep(0.5)
        asyncio.run(retire_then_forget())
        with pytest.raises(KeyError):
            router.replica("127.0.0.2:7")                                   # its channel closed, forgotten


def test_a_malformed_target_stops_the_orchestrator_with_one_line():
    done = subprocess.run([sys.executable, "-m", "orchestrator.server", "--port", "0", "--metrics-port", "-1",
                           "--inference", "dns:///inference"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["error: --inference 'dns:///inference': a DNS target is "
                                                "dns:///NAME:PORT (or dns://DNS_SERVER[:PORT]/NAME:PORT), "
                                                "with the replicas' port"]


@pytest.fixture
def replicas_behind_a_name(embedded_model_dir, tmp_path):
    """(dns server, replicas on HOSTS at one port, orchestrator over dns://that server/NAME:port)."""
    with contextlib.ExitStack() as stack, DnsServer() as dns:
        port = port_free_on(HOSTS)
        replicas = []
        for host in HOSTS:
            replica = RunningInference(embedded_model_dir, host=host, port=port, kv_device_blocks=128, token_budget=256)
            stack.callback(replica.stop)
            replicas.append(replica)
        redis = PrivateRedis(tmp_path)
        stack.callback(redis.stop)
        dns.set(NAME, [HOSTS[0]])
        orchestrator = RunningOrchestrator(redis.url, [f"dns://127.0.0.1:{dns.port}/{NAME}:{port}"],
                                           dns_refresh_s=0.2)
        stack.callback(orchestrator.stop)
        yield dns, replicas, orchestrator


def test_replicas_come_and_go_behind_the_name_without_a_restart(replicas_behind_a_name):
    dns, (first, second), orchestrator = replicas_behind_a_name
    router = orchestrator.service.router
    routed = lambda: {r.address for r in router.replicas}  # noqa: E731
    available = lambda address: address in routed() and router.replica(address).available  # noqa: E731
    assert routed() == {first.address}
    assert ask(orchestrator.stub).replica == first.address

    dns.set(NAME, HOSTS)                                   # scaled up
    wait_for(lambda: available(second.address), "the added replica is available")
    assert first.address in routed()

    dns.set(NAME, HOSTS[1:])                               # scaled down
    wait_for(lambda: routed() == {second.address}, "the removed replica is retired")
    received = first.stats().counters.requests_received
    assert [ask(orchestrator.stub).replica for _ in range(2)] == [second.address] * 2
    assert first.stats().counters.requests_received == received     # no ask after its removal
    assert second.stats().counters.requests_received >= 2

    dns.set(NAME, HOSTS[:1])                               # the other way round: back on the first
    wait_for(lambda: routed() == {first.address} and available(first.address), "the first replica is back")
    assert ask(orchestrator.stub).replica == first.address


def test_a_name_that_resolves_to_nothing_starts_and_answers_unavailable_with_why(replicas_behind_a_name, caplog):
    dns, (first, _), orchestrator = replicas_behind_a_name
    router = orchestrator.service.router
    caplog.set_level(logging.WARNING, logger="orchestrator.discovery")
    dns.set(NAME, [])
    wait_for(lambda: not router.replicas, "the name's replicas are retired")
    assert any("resolves to no address" in r.getMessage() for r in caplog.records)
    with pytest.raises(grpc.RpcError) as err:
        ask(orchestrator.stub)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"{NAME} resolves to no address" in err.value.details()

    dns.set(NAME, [HOSTS[0]])
    wait_for(lambda: router.replicas and router.replicas[0].available, "the replica is back")
    assert ask(orchestrator.stub).replica == first.address


def test_an_orchestrator_starts_on_a_name_with_no_address(tmp_path, caplog):
    redis = PrivateRedis(tmp_path)
    try:
        with DnsServer() as dns:
            caplog.set_level(logging.WARNING, logger="orchestrator.discovery")
            orchestrator = RunningOrchestrator(redis.url, [f"dns://127.0.0.1:{dns.port}/{NAME}:50052"])
            try:
                assert any(f"{NAME} resolves to no address" in r.getMessage() for r in caplog.records)
                assert orchestrator.service.router.replicas == []
            finally:
                orchestrator.stop()
    finally:
        redis.stop()


@pytest.mark.slow   # a replica drained mid-answer (`bash scripts/test.sh --run-slow`)
def test_an_answer_on_a_replica_removed_then_gone_continues_on_the_other(replicas_behind_a_name):
    """Removed from the name mid-answer, the replica keeps its answer (drained, not cut); when the
    replica itself then goes away, the answer continues on the replica left behind the name."""
    dns, (first, second), orchestrator = replicas_behind_a_name
    router = orchestrator.service.router
    dns.set(NAME, HOSTS)
    wait_for(lambda: second.address in {r.address for r in router.replicas}
             and router.replica(second.address).available, "both replicas available")
    router.note_served(first.address, preamble_key())         # prefix locality: the first is chosen
    tokens, done, started = [], [], threading.Event()

    def long_answer() -> None:
        request = orchestrator_pb2.AskRequest(question="Tell me about the history of Paris.", retriever=NONE,
                                              max_tokens=LONG, sampling=common_pb2.SamplingParams(ignore_eos=True))
        for response in orchestrator.stub.Ask(request, timeout=300):
            kind = response.event.WhichOneof("kind")
            if kind == "token":
                tokens.append(response.event.token.text)
                started.set()
            elif kind == "done":
                done.append(response.event.done)

    answering = threading.Thread(target=long_answer)
    answering.start()
    assert started.wait(120), "the answer did not start"
    dns.set(NAME, HOSTS[1:])
    wait_for(lambda: {r.address for r in router.replicas} == {second.address}, "the first replica retired")
    first.stop()                                              # the retired replica goes away mid-answer
    answering.join(300)
    assert done, "the answer did not finish"
    assert done[0].replica == second.address and len(tokens) == LONG
