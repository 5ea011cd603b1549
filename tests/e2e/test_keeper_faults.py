"""The keeper's promise beyond the Ask: a plain generation and a session's calls outlive the parts
that die under them.

Real parts: Redis, two fp32 replicas, each behind a gate (tests/support/inference_gate.py) that holds
an answer at an exact token so a fault lands there without timing, and orchestrators (in this process,
or as processes where one is killed). After the fault the caller's answer equals the answer without
it (greedy fp32), token for token, nothing repeated or missing.
"""

from __future__ import annotations

import re
import threading
import time

import grpc
import pytest
import redis
from prometheus_client import generate_latest

from orchestrator.lifecycle_store import request_key
from protos import common_pb2, inference_pb2, inference_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from tests.support.gateway import RunningGateway
from tests.support.inference import RunningInference
from tests.support.inference_gate import InferenceGate
from tests.support.orchestrator import OrchestratorProcess, RunningOrchestrator
from tests.support.redis_server import PrivateRedis

HANG_S = 300          # a guard against a hang, not a timing bound
KILL_AFTER = 5
MAX_TOKENS = 24
PROMPT = "Write three short sentences about rivers."
LOG = ["09:00 web-1 started, version 2.4.1", "09:05 web-1 health check ok",
       "09:10 db-1 replication lag 3 s", "09:15 web-2 started, version 2.4.2"]
QUESTION = "Which version did web-2 start with, and which host lagged?"


class World:
    """Redis (kept on disk, so a restart keeps it) and two replicas behind gates."""

    def __init__(self, model_dir, root) -> None:
        self.parts: list = []
        self.redis = PrivateRedis(root, persist=True)
        self.parts.append(self.redis)
        self.replicas = [RunningInference(model_dir, kv_device_blocks=128, token_budget=256) for _ in range(2)]
        self.parts.extend(self.replicas)
        self.gates = [InferenceGate(r.address) for r in self.replicas]
        self.parts.extend(self.gates)

    def hold_next_answer(self, tokens: int) -> int:
        """Arm every gate; the index of the one that holds an answer (the others disarmed)."""
        for gate in self.gates:
            gate.arm(tokens)
        holder, give_up = None, time.monotonic() + HANG_S
        while holder is None:
            assert time.monotonic() < give_up, "no answer reached the gate"
            holder = next((i for i, g in enumerate(self.gates) if g.held.wait(0.05)), None)
        for gate in self.gates:
            gate.hold_at = None
        return holder

    def kill_held(self, holder: int) -> None:
        """The holding gate's replica dies (its engine and server go); the held call breaks."""
        self.replicas[holder].stop()
        self.gates[holder].release()

    def stop(self) -> None:
        for part in reversed(self.parts):
            part.stop()


@pytest.fixture
def world(embedded_model_dir, tmp_path):
    world = World(embedded_model_dir, tmp_path)
    yield world
    world.stop()


@pytest.fixture
def orchestrator(world):
    running = RunningOrchestrator(world.redis.url, [g.address for g in world.gates], router_refresh_s=3600)
    yield running
    running.stop()


def tokens_of(responses) -> list[common_pb2.GeneratedToken]:
    return [r.event.token for r in responses if r.event.WhichOneof("kind") == "token"]


def generate_request(request_id: str) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(request_id=request_id, segments=[common_pb2.Segment(text=PROMPT)],
                                         sampling=common_pb2.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))


def events_of(world: World, request_id: str) -> list[dict]:
    store = redis.Redis.from_url(world.redis.url, decode_responses=True)
    return [fields for _, fields in store.xrange(f"{request_key(request_id)}:events")]


# --- a plain generation ------------------------------------------------------------------------
def test_a_plain_generate_whose_replica_dies_after_the_5th_token_is_continued_on_the_other(world, orchestrator):
    stub = inference_pb2_grpc.InferenceStub(orchestrator.channel)
    expected = tokens_of(world.replicas[0].stub.Generate(generate_request("reference"), timeout=HANG_S))
    assert len(expected) > KILL_AFTER
    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(responses=list(stub.Generate(
        generate_request("plain-kill"), timeout=HANG_S))), daemon=True)
    thread.start()
    dead = world.hold_next_answer(KILL_AFTER)
    world.kill_held(dead)
    thread.join(HANG_S)
    tokens = tokens_of(got["responses"])
    assert [(t.index, t.id) for t in tokens] == [(t.index, t.id) for t in expected]    # once each, in order
    done = got["responses"][-1].event.done
    assert done.text == "".join(t.text for t in expected) and done.stats.generated_tokens == len(expected)
    events = events_of(world, "plain-kill")
    continued = [e for e in events if e["kind"] == "CONTINUED"]
    assert len(continued) == 1 and int(continued[0]["tokens"]) >= KILL_AFTER, events
    assert continued[0]["replica"] == world.gates[1 - dead].address
    assert events[-1]["kind"] == "DONE"
    scraped = generate_latest(orchestrator.service.metrics.registry).decode()   # what /metrics shows
    assert 'streamrag_ask_continuations_total{cause="CONTINUED"} 1.0' in scraped


def test_a_gateway_chat_survives_its_orchestrator_killed_after_the_5th_token(world, tmp_path):
    import openai

    from gateway.app import GatewaySettings

    orchestrators = [OrchestratorProcess(world.redis.url, [g.address for g in world.gates],
                                         log_path=tmp_path / f"orchestrator-{i}.log") for i in range(2)]
    gateway = RunningGateway(GatewaySettings(orchestrator=",".join(o.address for o in orchestrators)))
    try:
        model = gateway_model(gateway)
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=HANG_S)
        expected = chat(client, model)                     # the same chat, no fault
        pieces, finishes, final = [], [], {}

        def read():
            try:
                for chunk in client.chat.completions.create(model=model, stream=True, max_tokens=MAX_TOKENS,
                                                            temperature=0, stream_options={"include_usage": True},
                                                            messages=[{"role": "user", "content": PROMPT}]):
                    pieces.extend(choice.delta.content or "" for choice in chunk.choices)
                    finishes.extend(choice.finish_reason for choice in chunk.choices if choice.finish_reason)
                    if chunk.usage:
                        final["usage"] = chunk.usage
            except BaseException as exc:
                final["error"] = exc

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        holder = world.hold_next_answer(KILL_AFTER)
        peer_port = int(world.gates[holder].held_peer.rsplit(":", 1)[1])
        victim = next(o for o in orchestrators if owns_port(o, peer_port))
        victim.kill()
        world.gates[holder].release()
        reader.join(HANG_S)
        assert "error" not in final, final.get("error")
        assert "".join(pieces) == expected["text"]
        assert final["usage"].completion_tokens == expected["tokens"] and finishes == [expected["finish"]]
    finally:
        gateway.stop()
        for orchestrator in orchestrators:
            orchestrator.stop()


def gateway_model(gateway) -> str:
    import httpx

    from gateway.protocol import RAG_MODEL

    models = [m["id"] for m in httpx.get(f"{gateway.base_url}/v1/models", timeout=60).json()["data"]]
    return next(model for model in models if model != RAG_MODEL)        # the served model: a plain chat


def chat(client, model: str) -> dict:
    response = client.chat.completions.create(model=model, max_tokens=MAX_TOKENS, temperature=0,
                                              messages=[{"role": "user", "content": PROMPT}])
    return {"text": response.choices[0].message.content, "tokens": response.usage.completion_tokens,
            "finish": response.choices[0].finish_reason}


def owns_port(orchestrator: OrchestratorProcess, port: int) -> bool:
    import psutil

    return any(c.laddr and c.laddr.port == port for c in psutil.Process(orchestrator.proc.pid).net_connections())


# --- a session's calls ---------------------------------------------------------------------------
def open_session(stub, session_id: str = "log") -> None:
    stub.CreateSession(sessions_pb2.CreateSessionRequest(session_id=session_id, instructions="Answer briefly."),
                       timeout=120)
    stub.Ingest(iter([sessions_pb2.IngestRequest(session_id=session_id, segments=[
        common_pb2.Segment(text=t) for t in batch]) for batch in (LOG[:2], LOG[2:])]), timeout=120)


def query(stub, request_id: str) -> list[sessions_pb2.QueryResponse]:
    return list(stub.Query(sessions_pb2.QueryRequest(
        session_id="log", question=QUESTION, request_id=request_id, min_data_version=2,
        sampling=common_pb2.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)), timeout=HANG_S))


def token_ids(responses: list[sessions_pb2.QueryResponse]) -> list[tuple[int, int]]:
    return [(r.token.index, r.token.id) for r in responses if r.WhichOneof("kind") == "token"]


def test_a_session_query_whose_replica_dies_mid_answer_is_answered_again_on_the_rebuilt_session(world,
                                                                                                 orchestrator):
    stub = sessions_pb2_grpc.SessionsStub(orchestrator.channel)
    open_session(stub)
    before = query(stub, "q-before")
    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(responses=query(stub, "q-kill")), daemon=True)
    thread.start()
    dead = world.hold_next_answer(KILL_AFTER)
    world.kill_held(dead)
    thread.join(HANG_S)
    after = got["responses"]
    kinds = [r.WhichOneof("kind") for r in after]
    assert kinds == [r.WhichOneof("kind") for r in before] and kinds[0] == "started" and kinds[-1] == "done"
    assert token_ids(after) == token_ids(before)     # once each, in order
    assert after[-1].done.text == before[-1].done.text and after[0].started.data_version == 2
    moves = [e["detail"] for e in events_of(world, "q-kill") if e["kind"] == "ERROR"]
    # the gate had a few more tokens on their way when the replica went: at least the 5 held
    after_tokens = re.search(r"session rebuilt, answering again after (\d+) tokens", moves[0]) if moves else None
    assert len(moves) == 1 and after_tokens and int(after_tokens.group(1)) >= KILL_AFTER, moves
    assert events_of(world, "q-kill")[-1]["kind"] == "DONE"


def test_a_session_call_made_while_redis_restarts_waits_for_it(world, orchestrator):
    stub = sessions_pb2_grpc.SessionsStub(orchestrator.channel)
    open_session(stub)
    directory = orchestrator.service.directory
    world.redis.stop()
    got: dict = {}

    def ingest():
        try:
            got["response"] = stub.Ingest(iter([sessions_pb2.IngestRequest(
                session_id="log", segments=[common_pb2.Segment(text="09:20 web-1 stopped")])]), timeout=HANG_S)
        except grpc.RpcError as exc:
            got["error"] = exc

    thread = threading.Thread(target=ingest, daemon=True)
    thread.start()
    give_up = time.monotonic() + HANG_S
    while directory.unreachable == 0:             # the call is in flight, waiting for Redis
        assert time.monotonic() < give_up and thread.is_alive(), got
        time.sleep(0.05)
    world.redis.restart()
    thread.join(HANG_S)
    assert "error" not in got, got.get("error")
    assert got["response"].data_version == 3
    answer = query(stub, "q-after-redis")
    assert answer[0].started.data_version >= 2 and answer[-1].WhichOneof("kind") == "done"


def test_a_session_query_outlives_its_orchestrator_killed_mid_answer(world, tmp_path):
    """The client re-issues the query to the other orchestrator (servicekit/session_reissue.py): the same
    data, nothing passed on twice, the same greedy answer."""
    from servicekit.channels import RECONNECT_OPTIONS, spread_options, spread_target
    from servicekit.session_reissue import ResumableQuery

    orchestrators = [OrchestratorProcess(world.redis.url, [g.address for g in world.gates],
                                         log_path=tmp_path / f"orchestrator-{i}.log") for i in range(2)]
    channel = grpc.insecure_channel(spread_target([o.address for o in orchestrators]),
                                    options=[*RECONNECT_OPTIONS, *spread_options()])
    try:
        stub = sessions_pb2_grpc.SessionsStub(channel)
        open_session(stub)
        before = query(stub, "q-before")
        got: dict = {}

        def ask():
            request = sessions_pb2.QueryRequest(session_id="log", question=QUESTION, request_id="q-orchestrator",
                                                sampling=common_pb2.SamplingParams(max_tokens=MAX_TOKENS,
                                                                                   ignore_eos=True))
            try:
                got["responses"] = list(ResumableQuery(lambda r: stub.Query(r, timeout=HANG_S), request))
            except grpc.RpcError as exc:
                got["error"] = exc

        thread = threading.Thread(target=ask, daemon=True)
        thread.start()
        holder = world.hold_next_answer(KILL_AFTER)
        peer_port = int(world.gates[holder].held_peer.rsplit(":", 1)[1])
        next(o for o in orchestrators if owns_port(o, peer_port)).kill()
        world.gates[holder].release()
        thread.join(HANG_S)
        assert "error" not in got, got.get("error")
        after = got["responses"]
        assert [r.WhichOneof("kind") for r in after] == [r.WhichOneof("kind") for r in before], after[-1]
        assert token_ids(after) == token_ids(before) and after[-1].done.text == before[-1].done.text
    finally:
        channel.close()
        for orchestrator in orchestrators:
            orchestrator.stop()


def test_a_reissued_ingest_does_not_add_a_batch_that_landed_before_the_break(world, orchestrator):
    from protos.metadata import INGEST_AFTER_KEY

    stub = sessions_pb2_grpc.SessionsStub(orchestrator.channel)
    open_session(stub)                                           # versions 1 and 2
    batch = sessions_pb2.IngestRequest(session_id="log", segments=[common_pb2.Segment(text="09:20 web-1 stopped")])
    assert stub.Ingest(iter([batch]), timeout=120).data_version == 3
    again = stub.Ingest(iter([batch]), timeout=120, metadata=((INGEST_AFTER_KEY, "2"),))   # the re-issue of it
    assert again.data_version == 3
    info = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="log"), timeout=60).session
    assert info.data_version == 3 and info.segments == 5
    later = stub.Ingest(iter([batch, batch]), timeout=120, metadata=((INGEST_AFTER_KEY, "2"),))  # one landed
    assert later.data_version == 4
    assert redis.Redis.from_url(world.redis.url).llen("streamrag:session:log:batches") == 4
