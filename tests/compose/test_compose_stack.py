"""The compose stack for real (opt-in): build the images, `up` the stack with an API key and TLS
(compose/docker-compose.tls.yml, certificates from scripts/make_certs.sh), ask through the
gateway with the official `openai` client, read the lifecycles back from Redis, crash
containers, tear down.

    bash scripts/test.sh tests/compose --run-compose

Needs a running dockerd and docker-compose (v1) or the docker compose plugin (v2). The images
are built by scripts/build_compose_images.sh (local base images, since no registry can be
reached here; the torch wheel; this machine's CA certificates), with the ANNS index of the
Python tutorial only: the full docs take ~8 minutes of embedding. Each of its settings is an
environment variable the suite passes on unless already set (`STREAMRAG_BASE_IMAGE`,
`STREAMRAG_REDIS_IMAGE`, `STREAMRAG_TORCH_INDEX_URL`, `STREAMRAG_INDEX_SOURCE`; see
compose/README.md). The stack runs as its own compose project with the gateway published on a free
port (the only published port), so it never touches a stack a user runs. What needs the services
inside the network (GetRequest on the orchestrator) runs in the orchestrator's container with
`exec`. The tests run in file order on one stack; their timings are printed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest

from servicekit.health import check_health
from servicekit.tls import TlsFiles

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]   # the images build in the fixture

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "streamrag-suite"
TUTORIAL = "/usr/share/doc/python3.11/html/tutorial"
QUESTION = "How do I read a file line by line?"
DEPENDENCIES = ["redis", "corpus", "anns", "crawler", "inference-0", "inference-1", "orchestrator"]
RAG_MODEL = "streamrag-rag"
REPLICAS = ("inference-0:50052", "inference-1:50052")
# Run in the orchestrator's container (`exec`): GetRequest for each request id given, as JSON, over
# the orchestrator's own TLS files and with the key (both from the container's environment).
GET_REQUESTS = """
import json, os, sys
from pathlib import Path
import grpc
from google.protobuf.json_format import MessageToDict
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.auth import bearer_metadata
from servicekit.tls import TlsFiles
files = [os.environ.get(f"STREAMRAG_ORCHESTRATOR_TLS_{part}") for part in ("CERT", "KEY", "CA")]
channel = grpc.secure_channel("127.0.0.1:50051", TlsFiles(*(Path(f) for f in files)).channel_credentials()) \\
    if files[2] else grpc.insecure_channel("127.0.0.1:50051")
stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
out = {}
for request_id in sys.argv[1:]:
    try:
        record = stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=request_id), timeout=30,
                                 metadata=bearer_metadata(os.environ.get("STREAMRAG_API_KEY"))).record
        out[request_id] = MessageToDict(record, preserving_proto_field_name=True)
    except grpc.RpcError as exc:
        out[request_id] = {"error": exc.code().name, "details": exc.details()}
print(json.dumps(out))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComposeStack:
    def __init__(self, overrides: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        """`overrides`: more compose files, after docker-compose.yml and docker-compose.tls.yml; `env`: more
        variables for compose (those the overrides read)."""
        self.files = ["compose/docker-compose.yml", "compose/docker-compose.tls.yml", *overrides]
        self.compose = ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]
        self.port = free_port()
        self.key = f"sk-{secrets.token_hex(16)}"
        self.certs = Path(tempfile.mkdtemp(prefix="streamrag-compose-certs-"))
        subprocess.run(["bash", "scripts/make_certs.sh", str(self.certs)], cwd=ROOT, check=True, capture_output=True,
                       timeout=120)
        self.env = dict(os.environ, COMPOSE_PROJECT_NAME=PROJECT, STREAMRAG_GATEWAY_PORT=str(self.port),
                        STREAMRAG_API_KEY=self.key, STREAMRAG_TLS_DIR=str(self.certs), **(env or {}))
        # The defaults of scripts/build_compose_images.sh (no registry): set these to build from a registry's images.
        for name, default in (("STREAMRAG_BASE_IMAGE", "local/python:3.11"), ("STREAMRAG_REDIS_IMAGE", "local/redis:7"),
                              ("STREAMRAG_TORCH_INDEX_URL", "https://pypi.org/simple"),
                              ("STREAMRAG_INDEX_SOURCE", TUTORIAL)):
            self.env.setdefault(name, default)
        self.gateway = f"https://127.0.0.1:{self.port}"
        self.ca = self.certs / "ca.crt"
        self.timings: dict[str, float] = {}
        self.request_ids: dict[str, str] = {}
        self.health_after_up: dict[str, str] = {}

    def run(self, *args: str, timeout: float = 900, check: bool = True,
            stdin: str | None = None) -> subprocess.CompletedProcess:
        files = [arg for file in self.files for arg in ("-f", file)]
        result = subprocess.run([*self.compose, "-p", PROJECT, *files, *args], cwd=ROOT, input=stdin,
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

    def client(self, key: str | None = None) -> openai.OpenAI:
        """The official client on the published gateway, verifying its certificate against the CA."""
        return openai.OpenAI(base_url=f"{self.gateway}/v1", api_key=key or self.key, max_retries=0, timeout=300,
                             http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(self.ca))))

    def records(self, *request_ids: str) -> dict[str, dict]:
        """GetRequest for each id, asked inside the orchestrator's container (the port is not published)."""
        result = self.run("exec", "-T", "orchestrator", "python", "-", *request_ids, stdin=GET_REQUESTS, timeout=120)
        return json.loads(result.stdout.strip().splitlines()[-1])

    def timed(self, name: str, t0: float) -> None:
        self.timings[name] = round(time.monotonic() - t0, 1)


@pytest.fixture(scope="module")
def stack(request):
    with running_stack(request) as s:
        yield s


@contextlib.contextmanager
def running_stack(request, overrides: tuple[str, ...] = (), env: dict[str, str] | None = None):
    """Build the images, `up -d` the stack (with `overrides`, and `env` for compose), wait for the gateway;
    `down -v` after."""
    docker = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60) \
        if shutil.which("docker") else None
    if docker is None or docker.returncode != 0:
        pytest.fail("the compose suite needs a running dockerd (start it: `dockerd &`)")
    s = ComposeStack(overrides, env)
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
        # compose starts the orchestrator only once what it depends on is healthy, and the gateway once the
        # orchestrator is: so `up -d` returns with every dependency healthy already.
        s.health_after_up = {name: s.health(name) for name in DEPENDENCIES}
        t0 = time.monotonic()
        deadline = time.monotonic() + 300
        health = f"{s.gateway}/health"
        while (reason := check_health("http", health, 5.0, tls=TlsFiles(ca=s.ca))) is not None:
            assert time.monotonic() < deadline, f"the gateway is not healthy on {health}: {reason}"
            time.sleep(1)
        s.timed("gateway healthy after up", t0)
        yield s
    finally:
        t0 = time.monotonic()
        s.run("down", "-v", "--remove-orphans", check=False, timeout=300)
        s.timed("down", t0)
        s.timed("whole suite", t_all)
        shutil.rmtree(s.certs, ignore_errors=True)
        line = "compose suite timings (s): " + ", ".join(f"{k} {v}" for k, v in s.timings.items())
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\n{line}", flush=True)


def ask(stack: ComposeStack, streamed: bool, question: str = QUESTION) -> tuple[str, str, dict]:
    """A RAG chat completion through the gateway: (request id, answer, the `streamrag` extension)."""
    request = {"model": RAG_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": question}],
               "extra_body": {"retrieval": {"retriever": "anns"}}}
    with stack.client() as client:
        if not streamed:
            response = client.chat.completions.create(**request)
            return response.id, response.choices[0].message.content, response.model_extra["streamrag"]
        chunks = list(client.chat.completions.create(**request, stream=True))
    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    extension = next(c.model_extra["streamrag"] for c in chunks if c.model_extra.get("streamrag"))
    return chunks[0].id, answer, extension


def test_up_starts_each_service_only_once_its_dependencies_are_healthy(stack):
    assert stack.health_after_up == dict.fromkeys(DEPENDENCIES, "healthy")
    gateway = stack.inspect("gateway")["State"]
    assert gateway["Running"] and gateway["Health"]["Status"] in ("starting", "healthy")


def test_only_the_gateway_is_published(stack):
    published = {}
    for service in [*DEPENDENCIES, "gateway"]:
        ports = stack.inspect(service)["NetworkSettings"]["Ports"] or {}
        bound = [b["HostPort"] for bindings in ports.values() if bindings for b in bindings]
        if bound:
            published[service] = set(bound)
    assert published == {"gateway": {str(stack.port)}}


def test_the_gateway_wants_the_key(stack):
    trusting = ssl.create_default_context(cafile=str(stack.ca))
    answer = httpx.get(f"{stack.gateway}/v1/models", verify=trusting, timeout=60)
    assert answer.status_code == 401
    with stack.client("sk-wrong") as client, pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_a_question_is_answered_through_the_gateway_streamed_and_not(stack):
    t0 = time.monotonic()
    for streamed in (True, False):
        request_id, answer, extension = ask(stack, streamed)
        assert answer and extension["sources"] and extension["replica"] in REPLICAS
        stack.request_ids["streamed" if streamed else "not streamed"] = request_id
    with stack.client() as client:
        model = client.models.list().data[-1].id
        plain = client.chat.completions.create(model=model, max_tokens=8,
                                               messages=[{"role": "user", "content": QUESTION}])
    assert plain.choices[0].message.content
    stack.request_ids["plain"] = plain.id
    stack.timed("three requests", t0)


def test_each_lifecycle_is_stored_in_redis(stack):
    records = stack.records(*stack.request_ids.values())
    for kind, request_id in stack.request_ids.items():
        record = records[request_id]
        assert record.get("state") == "REQUEST_STATE_FINISHED" and record["question"] == QUESTION, record
        assert record["answer"] and record["replica"] in REPLICAS
        kinds = [e["kind"] for e in record["events"]]
        assert {"QUEUED", "SCHEDULED", "DONE"} <= set(kinds), kinds
        if kind == "plain":
            assert record["retriever"] == "RETRIEVER_CHOICE_NONE" and "RETRIEVAL_CHUNK" not in kinds
        else:
            assert "RETRIEVAL_CHUNK" in kinds and kinds.index("RETRIEVAL_CHUNK") < kinds.index("DONE")


def test_killed_replicas_are_reported_then_restarted_and_used_again(stack):
    t0 = time.monotonic()
    restarts = {replica: stack.crash(replica) for replica in ("inference-0", "inference-1")}
    # An Ask in this window waits for a replica (the orchestrator's fail-over) and the gateway re-issues a
    # broken one (resume): it ends answered by a restarted replica, or with a 503 that says why.
    try:
        _, answer, _ = ask(stack, streamed=True)
        assert answer
    except openai.APIStatusError as exc:
        assert exc.status_code == 503, exc
        # "no replica left after ...", "no inference replica available (...)" or the last replica's
        # connection error, depending on when the router's poll noticed.
        assert exc.body and exc.body.get("message"), "a 503 must say why"
    logs = stack.logs("orchestrator")
    assert "replica inference-0:50052 unavailable" in logs and "replica inference-1:50052 unavailable" in logs
    stack.timed("replicas reported down", t0)

    for replica, count in restarts.items():                           # restart: unless-stopped
        stack.wait_restarted(replica, count, seconds=400)
    deadline = time.monotonic() + 60
    while True:
        try:
            _, answer, extension = ask(stack, streamed=True)
            break
        except openai.APIError as exc:
            assert time.monotonic() < deadline, f"the restarted replicas are not used: {exc}"
            time.sleep(2)
    assert extension["replica"] in REPLICAS and answer
    assert "is serving again" in stack.logs("orchestrator")         # orchestrator/router.py record_health
    stack.timed("replicas back and used again", t0)


def test_redis_keeps_the_lifecycles_across_a_crash(stack):
    t0 = time.monotonic()
    time.sleep(2)                                # appendfsync everysec
    stack.wait_restarted("redis", stack.crash("redis"), seconds=120)
    deadline = time.monotonic() + 60
    request_id = stack.request_ids["streamed"]
    while "error" in (record := stack.records(request_id)[request_id]):
        assert time.monotonic() < deadline, record
        time.sleep(1)
    assert record["state"] == "REQUEST_STATE_FINISHED" and record["events"]
    stack.timed("redis back with its data", t0)
