"""A broken answer resumes where it stopped (issue 42).

Two orchestrators, each its own process, over one Redis; two fp32 replicas, each behind a gate
(tests/support/inference_gate.py) that holds an answer at an exact token so a fault lands there
without timing. The clients are the real ones: `streamrag ask`'s code path (`stream_answer`) and
the gateway through the official `openai` package, both dialling the two orchestrators with
round_robin. After the fault the client's answer equals Generate's on the prompt the lifecycle
store recorded (greedy fp32), token for token, with nothing repeated or missing.
"""

from __future__ import annotations

import asyncio
import base64
import re
import threading
import time
from pathlib import Path

import grpc
import psutil
import pytest
import redis

from orchestrator.lifecycle_store import request_key
from orchestrator.resume import PROMPT_FIELD
from protos import inference_pb2, orchestrator_pb2
from retriever_svc.replay.backend import ReplayBackend
from retriever_svc.replay.trace import Trace, TraceChunk, TraceDocument, TraceQuery
from streamrag.ask import StatusLine, stream_answer
from tests.support.gateway import RunningGateway
from tests.support.inference import RunningInference
from tests.support.inference_gate import InferenceGate
from tests.support.orchestrator import OrchestratorProcess
from tests.support.redis_server import PrivateRedis
from tests.support.retrievers import RunningRetriever

QUESTION = "How do I read a text file in Python?"
MAX_TOKENS = 24
KILL_AFTER = 5
HANG_S = 300          # a guard against a hang, not a timing bound
TRACE = Trace((TraceQuery("files", QUESTION, "anns", "synthesized", (
    TraceChunk(0.0, "append", False, (TraceDocument("d1", "Reading files", "http://x/files.html",
                                                    "Use open(path) to open a file and read() to read it."),)),
    TraceChunk(0.0, "append", True, (TraceDocument("d2", "The with statement", "http://x/with.html",
                                                   "The with statement closes the file when the block ends."),)),
)),))


class World:
    """Redis, a replay retriever (serving as the orchestrators' "anns"), two replicas behind gates."""

    def __init__(self, model_dir: Path, root: Path) -> None:
        self.root = root
        self.parts: list = []
        self.redis = PrivateRedis(root)
        self.parts.append(self.redis)
        self.retriever = RunningRetriever(ReplayBackend(TRACE, name="files"), "replay")
        self.parts.append(self.retriever)
        self.replicas = [RunningInference(model_dir, kv_device_blocks=128, token_budget=256) for _ in range(2)]
        self.parts.extend(self.replicas)
        self.gates = [InferenceGate(r.address) for r in self.replicas]
        self.parts.extend(self.gates)

    def orchestrators(self, n: int) -> list[OrchestratorProcess]:
        return [OrchestratorProcess(self.redis.url, [g.address for g in self.gates], anns=self.retriever.address,
                                    log_path=self.root / f"orchestrator-{i}.log") for i in range(n)]

    def stop(self) -> None:
        for part in reversed(self.parts):
            part.stop()            # each runner's stop is a no-op on one a test already stopped


@pytest.fixture(scope="module")
def world(embedded_model_dir, tmp_path_factory):
    world = World(embedded_model_dir, tmp_path_factory.mktemp("resume"))
    yield world
    world.stop()


@pytest.fixture
def orchestrators(world):
    started = world.orchestrators(2)
    yield started
    for orchestrator in started:
        orchestrator.stop()


# --- helpers -------------------------------------------------------------------------------
def reference(world: World, request_id: str, replica: int = 1) -> list[inference_pb2.GeneratedToken]:
    """Generate's tokens (greedy, fp32) for the prompt the store recorded for `request_id`."""
    encoded = redis.Redis.from_url(world.redis.url).hget(request_key(request_id), PROMPT_FIELD)
    assert encoded, f"no prompt recorded for {request_id}"
    prompt = orchestrator_pb2.AskPrompt.FromString(base64.b64decode(encoded))
    assert [d.id for d in prompt.sources] == ["d1", "d2"]     # the retrieved chunks, as sent
    events = world.replicas[replica].stub.Generate(inference_pb2.GenerateRequest(
        request_id=f"reference-{request_id}", segments=prompt.segments, sampling=prompt.sampling), timeout=300)
    return [response.event.token for response in events if response.event.WhichOneof("kind") == "token"]


def hold_next_answer(world: World, tokens: int) -> InferenceGate:
    """Arm every gate; the one that holds an answer is returned, the others disarmed."""
    for gate in world.gates:
        gate.arm(tokens)
    holder, give_up = None, time.monotonic() + HANG_S
    while holder is None:
        assert time.monotonic() < give_up, "no answer reached the gate"
        holder = next((g for g in world.gates if g.held.wait(0.05)), None)
    for gate in world.gates:
        gate.hold_at = None
    return holder


def serving(orchestrators: list[OrchestratorProcess], gate: InferenceGate) -> OrchestratorProcess:
    """The orchestrator whose connection the held call came in on."""
    port = int(gate.held_peer.rsplit(":", 1)[1])
    for orchestrator in orchestrators:
        if any(c.laddr and c.laddr.port == port for c in psutil.Process(orchestrator.proc.pid).net_connections()):
            return orchestrator
    raise AssertionError(f"no orchestrator owns {gate.held_peer}")


def targets(orchestrators: list[OrchestratorProcess]) -> str:
    return ",".join(o.address for o in orchestrators)


class _Stdout:
    """What `streamrag ask` prints, one write per token."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        with self.changed:
            self.writes.append(text)
            self.changed.notify_all()
        return len(text)

    def flush(self) -> None:
        pass

    def wait_for(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.writes) >= count, HANG_S)


def cli_ask(orchestrators, request_id: str, out: _Stdout, results: dict) -> threading.Thread:
    request = orchestrator_pb2.AskRequest(question=QUESTION, max_tokens=MAX_TOKENS, request_id=request_id)

    def run():
        import sys

        real, sys.stdout = sys.stdout, out
        try:
            results["done"] = asyncio.run(stream_answer(request, targets(orchestrators), 300, StatusLine(False)))
        except BaseException as exc:
            results["error"] = exc
        finally:
            sys.stdout = real

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# --- streamrag ask ---------------------------------------------------------------------------
@pytest.mark.parametrize("kill_after", [KILL_AFTER, 0], ids=["after-5th-token", "before-first-token"])
def test_cli_answer_survives_its_orchestrator_killed(world, orchestrators, kill_after):
    out, results = _Stdout(), {}
    request_id = f"cli-kill-{kill_after}"
    thread = cli_ask(orchestrators, request_id, out, results)
    gate = hold_next_answer(world, kill_after)
    victim = serving(orchestrators, gate)
    out.wait_for(kill_after)
    victim.kill()
    gate.release()
    thread.join(300)
    assert "error" not in results, results.get("error")
    done = results["done"]
    expected = reference(world, request_id)
    assert "".join(out.writes) == "".join(t.text for t in expected)       # printed once each, in order
    assert len(out.writes) == len(expected)
    assert done.answer == "".join(t.text for t in expected)
    assert done.request_id == request_id and done.stats.generated_tokens == len(expected)
    assert [s.id for s in done.sources] == ["d1", "d2"]


def test_duplicate_request_id_after_the_answer_is_answered_again(world, orchestrators):
    """A finished request id asked again (no resume) is answered again, the same, not refused."""
    first, second = {}, {}
    for results in (first, second):
        out = _Stdout()
        cli_ask(orchestrators, "cli-twice", out, results).join(300)
        assert "error" not in results, results.get("error")
    assert first["done"].answer == second["done"].answer


def test_resume_of_an_unknown_request_is_not_found(world, orchestrators):
    from protos import orchestrator_pb2_grpc

    with grpc.insecure_channel(orchestrators[0].address) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        request = orchestrator_pb2.AskRequest(question=QUESTION, request_id="never-asked",
                                              resume=orchestrator_pb2.AskResume(token_ids=[1, 2], attempt=1))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Ask(request, timeout=60))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Ask(orchestrator_pb2.AskRequest(question=QUESTION, resume=orchestrator_pb2.AskResume(
                token_ids=[1])), timeout=60))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- the gateway, through the openai package -------------------------------------------------------
@pytest.mark.parametrize("kill_after", [KILL_AFTER, 0], ids=["after-5th-token", "before-first-token"])
def test_gateway_stream_survives_its_orchestrator_killed(world, orchestrators, kill_after):
    import openai

    from gateway.app import GatewaySettings

    gateway = RunningGateway(GatewaySettings(orchestrator=targets(orchestrators)))
    try:
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        pieces: list[str] = []
        final: dict = {}
        got = threading.Condition()

        def read():
            try:
                stream = client.chat.completions.create(model="streamrag-rag", stream=True, max_tokens=MAX_TOKENS,
                                                        temperature=0, messages=[{"role": "user",
                                                                                  "content": QUESTION}])
                for chunk in stream:
                    extra = getattr(chunk, "streamrag", None) or (chunk.model_extra or {}).get("streamrag")
                    if extra:
                        final.update(extra)
                    for choice in chunk.choices:
                        if choice.delta.content:
                            with got:
                                pieces.append(choice.delta.content)
                                got.notify_all()
            except BaseException as exc:
                final["error"] = exc
            finally:
                with got:
                    final["ended"] = True
                    got.notify_all()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        gate = hold_next_answer(world, kill_after)
        victim = serving(orchestrators, gate)
        if kill_after:
            with got:     # the client has the first tokens before the kill
                got.wait_for(lambda: len("".join(pieces)) > 0 and "ended" not in final)
        victim.kill()
        gate.release()
        reader.join(300)
        assert "error" not in final, final.get("error")
        request_id = final["request_id"]
        expected = "".join(t.text for t in reference(world, request_id))
        assert "".join(pieces) == expected
    finally:
        gateway.stop()


# --- a replica dies under an Ask (last: it stops one of the module's replicas) --------------------
def test_a_replica_killed_after_the_5th_token_is_continued_on_the_other(world, orchestrators):
    out, results = _Stdout(), {}
    thread = cli_ask(orchestrators, "replica-kill", out, results)
    gate = hold_next_answer(world, KILL_AFTER)
    dead = world.gates.index(gate)
    out.wait_for(KILL_AFTER)
    world.replicas[dead].stop()            # the engine and its server go; the gate sees its call break
    gate.release()
    thread.join(300)
    assert "error" not in results, results.get("error")
    done = results["done"]
    expected = reference(world, "replica-kill", replica=1 - dead)
    assert "".join(out.writes) == done.answer == "".join(t.text for t in expected)
    assert len(out.writes) == len(expected) == done.stats.generated_tokens
    assert done.replica == world.gates[1 - dead].address
    store = redis.Redis.from_url(world.redis.url, decode_responses=True)
    moves = [fields["detail"] for _, fields in store.xrange(f"{request_key('replica-kill')}:events")
             if fields.get("kind") == "ERROR"]
    # the gate had a few more tokens on their way when the replica went: at least the 5 held
    assert any(re.search(r"continuing after ([5-9]|\d\d) tokens", move) for move in moves), moves
    # what the continuation cost is recorded: the tokens it continued after, the KV computed again, its wait
    continued = [fields for _, fields in store.xrange(f"{request_key('replica-kill')}:events")
                 if fields.get("kind") == "CONTINUED"]
    assert len(continued) == 1 and int(continued[0]["tokens"]) >= KILL_AFTER, continued
    assert int(continued[0]["tokens_computed"]) + int(continued[0]["prefix_cache_hit_tokens"]) >= \
        int(continued[0]["prompt_tokens"]) > int(continued[0]["tokens"]), continued
    assert float(continued[0]["first_token_s"]) >= 0, continued
