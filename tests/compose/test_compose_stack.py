"""The compose stack for real (opt-in): build the images, `up` the stack, ask, read the
lifecycle back from Redis, crash containers, tear down.

    bash scripts/test.sh tests/compose --run-compose

Needs a running dockerd and docker-compose (v1) or the docker compose plugin (v2). The images
are built by scripts/build_compose_images.sh (local base images, since no registry can be
reached here; the torch wheel; this machine's CA certificates), with the ANNS index of the
Python tutorial only: the full docs take ~8 minutes of embedding. Each of its settings is an
environment variable the suite passes on unless already set (`STREAMRAG_BASE_IMAGE`,
`STREAMRAG_REDIS_IMAGE`, `STREAMRAG_TORCH_INDEX_URL`, `STREAMRAG_INDEX_SOURCE`; see
compose/README.md). The stack runs as its own compose project with the orchestrator published on a
free port, so it never touches a stack a user runs. The tests run in file order on one stack;
their timings are printed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.health import check_health

pytestmark = pytest.mark.compose

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "streamrag-suite"
TUTORIAL = "/usr/share/doc/python3.11/html/tutorial"
QUESTION = "How do I read a file line by line?"
DEPENDENCIES = ["redis", "corpus", "anns", "crawler", "inference-0", "inference-1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComposeStack:
    def __init__(self) -> None:
        self.compose = ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]
        self.port = free_port()
        self.env = dict(os.environ, COMPOSE_PROJECT_NAME=PROJECT, STREAMRAG_ORCHESTRATOR_PORT=str(self.port))
        # The defaults of scripts/build_compose_images.sh (no registry): set these to build from a registry's images.
        for name, default in (("STREAMRAG_BASE_IMAGE", "local/python:3.11"), ("STREAMRAG_REDIS_IMAGE", "local/redis:7"),
                              ("STREAMRAG_TORCH_INDEX_URL", "https://pypi.org/simple"),
                              ("STREAMRAG_INDEX_SOURCE", TUTORIAL)):
            self.env.setdefault(name, default)
        self.orchestrator = f"127.0.0.1:{self.port}"
        self.timings: dict[str, float] = {}
        self.request_ids: dict[str, str] = {}
        self.health_after_up: dict[str, str] = {}

    def run(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([*self.compose, "-p", PROJECT, "-f", "compose/docker-compose.yml", *args], cwd=ROOT,
                                env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            pytest.fail(f"{' '.join(args)} failed ({result.returncode}):\n"
                        f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return result

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()

    def inspect(self, service: str) -> dict:
        out = subprocess.run(["docker", "inspect", self.container(service)], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        return json.loads(out)[0]

    def health(self, service: str) -> str:
        state = self.inspect(service)["State"]
        return state.get("Health", {}).get("Status", state["Status"])

    def crash(self, service: str) -> int:
        """SIGKILL the container's main process from the host: a crash, which the restart policy
        answers. (`docker kill` would not do: Docker counts it as a deliberate stop and leaves the
        container down.) Returns the container's restart count before the crash."""
        before = self.inspect(service)
        os.kill(before["State"]["Pid"], signal.SIGKILL)
        return before["RestartCount"]

    def wait_restarted(self, service: str, count_before: int, seconds: float) -> None:
        """Until the restart policy started the container again and it is healthy."""
        deadline = time.monotonic() + seconds
        while self.inspect(service)["RestartCount"] <= count_before:
            assert time.monotonic() < deadline, f"{service} was not restarted after {seconds:.0f} s"
            time.sleep(1)
        self.wait_healthy([service], max(1.0, deadline - time.monotonic()))

    def logs(self, service: str) -> str:
        return self.run("logs", "--no-color", service).stdout

    def wait_healthy(self, services: list[str], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (unhealthy := {s: self.health(s) for s in services if self.health(s) != "healthy"}):
            assert time.monotonic() < deadline, f"not healthy after {seconds:.0f} s: {unhealthy}"
            time.sleep(3)

    def timed(self, name: str, t0: float) -> None:
        self.timings[name] = round(time.monotonic() - t0, 1)


@pytest.fixture(scope="module")
def stack(request):
    docker = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60) \
        if shutil.which("docker") else None
    if docker is None or docker.returncode != 0:
        pytest.fail("the compose suite needs a running dockerd (start it: `dockerd &`)")
    s = ComposeStack()
    t_all = time.monotonic()
    s.run("down", "-v", "--remove-orphans", check=False)          # what an interrupted run left
    try:
        t0 = time.monotonic()
        build = subprocess.run(["bash", "scripts/build_compose_images.sh"], cwd=ROOT, env=s.env, capture_output=True,
                               text=True, timeout=3600)
        assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
        s.timed("build", t0)
        t0 = time.monotonic()
        s.run("up", "-d")
        s.timed("up -d", t0)
        # compose starts the orchestrator only once what it depends on is healthy: so `up -d` returns with
        # every dependency healthy already.
        s.health_after_up = {name: s.health(name) for name in DEPENDENCIES}
        t0 = time.monotonic()
        deadline = time.monotonic() + 300
        while (reason := check_health("grpc", s.orchestrator, 2.0)) is not None:
            assert time.monotonic() < deadline, f"the orchestrator is not healthy on {s.orchestrator}: {reason}"
            time.sleep(1)
        s.timed("orchestrator healthy after up", t0)
        yield s
    finally:
        t0 = time.monotonic()
        s.run("down", "-v", "--remove-orphans", check=False, timeout=300)
        s.timed("down", t0)
        s.timed("whole suite", t_all)
        line = "compose suite timings (s): " + ", ".join(f"{k} {v}" for k, v in s.timings.items())
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\n{line}", flush=True)


def ask(address: str, streamed: bool, question: str = QUESTION) -> tuple[list, orchestrator_pb2.AskDone]:
    with grpc.insecure_channel(address) as channel:
        request = orchestrator_pb2.AskRequest(question=question, retriever=orchestrator_pb2.RETRIEVER_CHOICE_ANNS,
                                              no_stream=not streamed, max_tokens=16)
        events = [r.event for r in orchestrator_pb2_grpc.OrchestratorStub(channel).Ask(request, timeout=300)]
    assert events and events[-1].WhichOneof("kind") == "done", events[-1:]
    return events, events[-1].done


def get_request(address: str, request_id: str) -> orchestrator_pb2.RequestRecord:
    with grpc.insecure_channel(address) as channel:
        return orchestrator_pb2_grpc.OrchestratorStub(channel).GetRequest(
            orchestrator_pb2.GetRequestRequest(request_id=request_id), timeout=30).record


def test_up_starts_the_orchestrator_only_once_its_dependencies_are_healthy(stack):
    assert stack.health_after_up == dict.fromkeys(DEPENDENCIES, "healthy")
    orchestrator = stack.inspect("orchestrator")["State"]
    assert orchestrator["Running"] and orchestrator["Health"]["Status"] in ("starting", "healthy")


def test_a_question_is_answered_streamed_and_not(stack):
    t0 = time.monotonic()
    for streamed in (True, False):
        events, done = ask(stack.orchestrator, streamed)
        kinds = {e.WhichOneof("kind") for e in events}
        assert {"started", "retrieval", "lifecycle", "token", "done"} <= kinds, kinds
        assert done.answer and done.sources and done.replica in ("inference-0:50052", "inference-1:50052")
        stack.request_ids["streamed" if streamed else "baseline"] = done.request_id
    stack.timed("two asks", t0)


def test_each_lifecycle_is_stored_in_redis(stack):
    for mode, request_id in stack.request_ids.items():
        record = get_request(stack.orchestrator, request_id)
        assert record.state == orchestrator_pb2.REQUEST_STATE_FINISHED and record.question == QUESTION
        assert record.streamed == (mode == "streamed") and record.answer
        kinds = [e.kind for e in record.events]
        assert "RETRIEVAL_CHUNK" in kinds and "DONE" in kinds and kinds.index("RETRIEVAL_CHUNK") < kinds.index("DONE")
        assert {"QUEUED", "SCHEDULED"} <= set(kinds), kinds


def test_killed_replicas_are_reported_then_restarted_and_used_again(stack):
    t0 = time.monotonic()
    restarts = {replica: stack.crash(replica) for replica in ("inference-0", "inference-1")}
    deadline = time.monotonic() + 60
    while True:                                  # the orchestrator says why it cannot answer
        try:
            ask(stack.orchestrator, streamed=True)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                # "no replica left after ...", "no inference replica available (...)" or the last
                # replica's connection error, depending on when the router's poll noticed.
                assert exc.details(), "UNAVAILABLE must say why"
                break
        assert time.monotonic() < deadline, "an Ask still got an answer with both replicas killed"
        time.sleep(1)
    logs = stack.logs("orchestrator")
    assert "replica inference-0:50052 unavailable" in logs and "replica inference-1:50052 unavailable" in logs
    stack.timed("replicas reported down", t0)

    for replica, count in restarts.items():                           # restart: unless-stopped
        stack.wait_restarted(replica, count, seconds=400)
    deadline = time.monotonic() + 60
    while True:
        try:
            _, done = ask(stack.orchestrator, streamed=True)
            break
        except grpc.RpcError as exc:
            assert time.monotonic() < deadline, f"the restarted replicas are not used: {exc.details()}"
            time.sleep(2)
    assert done.replica in ("inference-0:50052", "inference-1:50052") and done.answer
    assert "is reachable again" in stack.logs("orchestrator")
    stack.timed("replicas back and used again", t0)


def test_redis_keeps_the_lifecycles_across_a_crash(stack):
    t0 = time.monotonic()
    time.sleep(2)                                # appendfsync everysec
    stack.wait_restarted("redis", stack.crash("redis"), seconds=120)
    deadline = time.monotonic() + 60
    while True:
        try:
            record = get_request(stack.orchestrator, stack.request_ids["streamed"])
            break
        except grpc.RpcError as exc:
            assert time.monotonic() < deadline, exc.details()
            time.sleep(1)
    assert record.state == orchestrator_pb2.REQUEST_STATE_FINISHED and record.events
    stack.timed("redis back with its data", t0)
