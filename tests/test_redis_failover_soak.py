"""The Redis primary killed under load: real redis-server primary, replica and three Sentinels; two
orchestrators (each its own process, `--redis redis+sentinel://...`) over a real fp32 replica behind
a gate and a replay retriever; users asking without pause through `ResumableAsk` over both
orchestrators, as `streamrag ask` and the gateway do.

Phase 1 kills the primary mid-soak (SIGKILL), lets the soak run on after the Sentinels promote the
replica, then starts the old primary again (the Sentinels make it the new primary's replica).
Phase 2 holds one answer at the gate, kills the primary again, then kills the orchestrator serving
that answer: the answer resumes on the other orchestrator from the prompt the store recorded before
the second failover.

It asserts behaviour, not timings: at least 99.5 % of asks answered, every answered ask's terminal
record (FINISHED, its answer) in Redis afterwards, and the resumed answer complete and recorded.
The figures are printed (`-s`) for the report.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil
import pytest

from orchestrator.lifecycle_store import request_key
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from retriever_svc.replay.trace import Trace, TraceChunk, TraceDocument, TraceQuery
from servicekit.ask_resume import ResumableAsk
from servicekit.channels import open_channel, spread_options, spread_target
from servicekit.redis_url import redis_client
from tests.support.gated_world import gated_world
from tests.support.inference_gate import InferenceGate
from tests.support.orchestrator import OrchestratorProcess
from tests.support.redis_sentinel import SentinelSet

QUESTION = "How do I read a text file in Python?"
USERS = 3
MAX_TOKENS = 8
ASKS_BEFORE_KILL = 15          # the soak is under way when the primary dies
ASKS_AFTER_FAILOVER = 30       # and goes on this long after the replica took over
HANG_S = 300                   # a guard against a hang, not a timing bound
TRACE = Trace((TraceQuery("files", QUESTION, "anns", "synthesized", (
    TraceChunk(0.0, "append", False, (TraceDocument("d1", "Reading files", "http://x/files.html",
                                                    "Use open(path) to open a file and read() to read it."),)),
    TraceChunk(0.0, "append", True, (TraceDocument("d2", "The with statement", "http://x/with.html",
                                                   "The with statement closes the file when the block ends."),)),
)),))


@dataclass
class Outcome:
    request_id: str
    answer: str | None = None          # None: failed
    error: str = ""
    resumes: int = 0


@dataclass
class Soak:
    """USERS users asking in a loop on their own event loop, until `stop()`."""

    targets: str
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        channel = open_channel(spread_target(self.targets), options=spread_options())
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        await asyncio.gather(*(self._user(stub, u) for u in range(USERS)))
        await channel.close()

    async def _user(self, stub, user: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            outcome = Outcome(f"soak-{user}-{n}")
            await ask(stub, outcome)
            with self.lock:
                self.outcomes.append(outcome)

    def count(self) -> int:
        with self.lock:
            return len(self.outcomes)

    def wait_for(self, count: int) -> None:
        give_up = time.monotonic() + HANG_S
        while self.count() < count:
            assert time.monotonic() < give_up and self.thread.is_alive(), f"the soak stalled at {self.count()} asks"
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(HANG_S)


async def ask(stub, outcome: Outcome) -> None:
    request = orchestrator_pb2.AskRequest(question=QUESTION, max_tokens=MAX_TOKENS, request_id=outcome.request_id)
    resumable = ResumableAsk(lambda a: stub.Ask(a, timeout=HANG_S), request)
    try:
        async for response in resumable:
            if response.event.WhichOneof("kind") == "done":
                outcome.answer = response.event.done.answer
    except grpc.RpcError as exc:
        outcome.error = f"{exc.code().name}: {exc.details()}"
    outcome.resumes = resumable.attempt
    if outcome.answer is None and not outcome.error:
        outcome.error = "the stream ended without its answer"


def serving(orchestrators: list[OrchestratorProcess], gate: InferenceGate) -> OrchestratorProcess:
    """The orchestrator whose connection the held call came in on."""
    port = int(gate.held_peer.rsplit(":", 1)[1])
    for orchestrator in orchestrators:
        if any(c.laddr and c.laddr.port == port for c in psutil.Process(orchestrator.proc.pid).net_connections()):
            return orchestrator
    raise AssertionError(f"no orchestrator owns {gate.held_peer}")


def lost_records(url: str, outcomes: list[Outcome]) -> list[str]:
    """The answered asks whose terminal record is missing or differs, once the writers are done."""
    client = redis_client(url, sync=True)
    try:
        give_up, lost = time.monotonic() + 120, []
        while True:
            lost = []
            for outcome in outcomes:
                record = client.hgetall(request_key(outcome.request_id))
                if record.get("state") != "FINISHED" or record.get("answer") != outcome.answer:
                    lost.append(f"{outcome.request_id}: {record.get('state')!r} {record.get('answer')!r}")
            if not lost or time.monotonic() > give_up:
                return lost
            time.sleep(1)
    finally:
        client.close()


@pytest.mark.slow            # a few minutes (`bash scripts/test.sh --run-slow`)
@pytest.mark.timeout(1500)
def test_asks_and_their_records_survive_the_redis_primary_killed_mid_soak(embedded_model_dir, tmp_path: Path):
    sentinels = lambda root: SentinelSet(root / "redis")   # noqa: E731
    with gated_world(embedded_model_dir, tmp_path, trace=TRACE, redis=sentinels) as w:
        redis_set, gate = w.redis, w.gate
        orchestrators = [w.parts.add(OrchestratorProcess(redis_set.url, [gate.address], anns=w.retriever.address,
                                                         log_path=tmp_path / f"orchestrator-{i}.log"))
                         for i in range(2)]
        targets = ",".join(o.address for o in orchestrators)

        # Phase 1: the primary dies mid-soak.
        soak = Soak(targets)
        soak.wait_for(ASKS_BEFORE_KILL)
        at_kill, killed_at = soak.count(), time.monotonic()
        first = redis_set.kill_primary()
        promoted_s = time.monotonic() - killed_at
        soak.wait_for(soak.count() + ASKS_AFTER_FAILOVER)
        redis_set.restart(first)                        # back, as the new primary's replica
        soak.wait_for(soak.count() + 5)
        soak.stop()
        outcomes = soak.outcomes
        answered = [o for o in outcomes if o.answer is not None]
        failed = [o for o in outcomes if o.answer is None]
        print(f"\nsoak: {len(outcomes)} asks ({at_kill} before the kill), {len(answered)} answered, "
              f"{len(failed)} failed, {sum(o.resumes > 0 for o in outcomes)} resumed; replica promoted "
              f"{promoted_s:.1f} s after the kill", flush=True)
        for o in failed[:5]:
            print(f"  failed {o.request_id}: {o.error}", flush=True)

        # Phase 2: an answer held at the gate across a second failover, then its orchestrator killed.
        gate.arm(3)
        held = Outcome("held-across-failover")

        async def held_ask() -> None:       # the channel is made on the loop that uses it
            channel = open_channel(spread_target(targets), options=spread_options())
            await ask(orchestrator_pb2_grpc.OrchestratorStub(channel), held)
            await channel.close()

        asker = threading.Thread(target=lambda: asyncio.run(held_ask()), daemon=True)
        asker.start()
        assert gate.held.wait(HANG_S), "no answer reached the gate"
        redis_set.kill_primary()
        serving(orchestrators, gate).kill()
        gate.release()
        asker.join(HANG_S)

        lost = lost_records(redis_set.url, [*answered, *([held] if held.answer is not None else [])])
        share = len(answered) / len(outcomes)
        print(f"answered {100 * share:.2f} %; terminal records lost: {len(lost)}; held ask: "
              f"{'answered' if held.answer else held.error} after {held.resumes} resume(s)", flush=True)

        assert share >= 0.995, [(o.request_id, o.error) for o in failed]
        assert lost == [], lost[:10]
        assert held.answer and held.resumes >= 1, held        # resumed on the other orchestrator
