"""The load: users asking questions (locust-style: each user a loop of ask, then think) and one
session ingesting data, each call recorded with its times and outcome.

The question set is deterministic: the first `questions` lines of load_tests/questions.txt, each
asked with each retriever (anns, crawler, both), streamed and not, in an order fixed by the
seed. Every ask has a deadline (the gRPC timeout); one that ends by it without an answer is hung.

Every ask goes the way `streamrag ask` and the gateway send theirs: one channel over every
orchestrator (gRPC's round_robin with health checking, `servicekit.channels.spread_target`), the
services' short reconnect back-off and keepalive, and the stream read through
`servicekit.ask_resume.ResumableAsk`, which re-issues an Ask whose orchestrator died as a resume
(same request id, the tokens it has). The soak's clients share one asyncio loop in a thread
(`Clients`); users, the probe and the reference pass block on it. Per ask it records each
re-issue (when, after how many tokens, how long until the next new token) and whether the tokens
arrived once each, in order (their indexes 0..n-1 and their text the answer).
"""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from protos.retrievers import LIVE_RETRIEVERS, RETRIEVER_CHOICES

RETRIEVERS = LIVE_RETRIEVERS
QUESTIONS_FILE = Path(__file__).resolve().parent.parent / "questions.txt"
HANG_MARGIN_S = 1.0           # an ask that ended this close to its deadline without an answer ran out of it


@dataclass(frozen=True)
class AskSpec:
    question: str
    retriever: str             # anns, crawler or both
    streamed: bool


def load_questions(limit: int, path: Path = QUESTIONS_FILE) -> list[str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")][:limit]


def ask_mix(questions: list[str], seed: int) -> list[AskSpec]:
    specs = [AskSpec(q, r, s) for q in questions for r in RETRIEVERS for s in (True, False)]
    random.Random(seed).shuffle(specs)
    return specs


@dataclass
class Reissue:
    at: float                          # monotonic: the Ask sent again (its stream had just broken)
    tokens: int                        # answer tokens the client had then
    broke_after_s: float               # from the last token (or the ask's start) to the break
    token_after_s: float | None = None   # from the re-issue to the next new token (None: none came)


@dataclass
class AskOutcome:
    user: int
    spec: AskSpec
    start: float                       # monotonic
    end: float = 0.0
    deadline_s: float = 0.0
    ok: bool = False
    code: str = ""                     # gRPC status name of a failure ("" when answered)
    detail: str = ""
    request_id: str = ""
    replica: str = ""
    answer: str = ""
    sources: tuple[str, ...] = ()      # ids of the documents in the final prompt, in order
    retrieved_from: tuple[str, ...] = ()   # retrievers whose chunks arrived
    lifecycle: dict[str, int] = field(default_factory=dict)   # kinds the client saw -> count
    chunks: int = 0                    # retrieval chunks the client saw
    reissues: list[Reissue] = field(default_factory=list)    # the client re-issued the Ask (a resume)
    tokens: int = 0                    # answer tokens the client got
    tokens_in_order: bool = True       # indexes 0..n-1, once each, and their text is the answer
    max_token_gap_s: float = 0.0       # the longest wait between two answer tokens (or start and first)

    @property
    def hung(self) -> bool:
        """No answer and no clear status before the deadline: the call ran out of it."""
        return not self.ok and (self.code == "DEADLINE_EXCEEDED"
                                or self.end - self.start >= self.deadline_s - HANG_MARGIN_S)


def needs(spec: AskSpec) -> tuple[str, ...]:
    """The retrievers an ask asked for."""
    return ("anns", "crawler") if spec.retriever == "both" else (spec.retriever,)


def orchestrator_channel(address: str, key: str | None, tls=None):
    """A sync channel over every orchestrator in `address` ("a:port,b:port"), as the CLI dials them; over TLS
    with `tls` (servicekit.tls.TlsFiles: the stack's client certificate and CA)."""
    from servicekit.auth import keyed_channel
    from servicekit.channels import KEEPALIVE_OPTIONS, RECONNECT_OPTIONS, spread_options, spread_target
    from servicekit.tls import ORCHESTRATORS

    return keyed_channel(spread_target(address), key=key, tls=tls, server_name=ORCHESTRATORS,
                         options=(*RECONNECT_OPTIONS, *KEEPALIVE_OPTIONS, *spread_options(wait_for_ready=False)))


class Clients:
    """The soak's Ask clients: one `grpc.aio` channel over every orchestrator, on one asyncio loop in a
    thread. `ask(spec, ...)` blocks the calling thread until that Ask ends. With `wait_for_ready` a call
    made while no orchestrator is ready waits for one within its deadline (`spread_options`). With `tls`
    (servicekit.tls.TlsFiles) the channel dials with TLS, presenting its certificate."""

    def __init__(self, address: str, key: str | None, wait_for_ready: bool = True, tls=None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="chaos-clients", daemon=True)
        self.thread.start()
        self.channel = self._run(self._open(address, key, wait_for_ready, tls))

    async def _open(self, address: str, key: str | None, wait_for_ready: bool, tls):
        from servicekit.channels import open_channel, spread_options, spread_target
        from servicekit.tls import ORCHESTRATORS

        return open_channel(spread_target(address), tls, options=spread_options(wait_for_ready=wait_for_ready),
                            api_key=key, server_name=ORCHESTRATORS)

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def ask(self, spec: AskSpec, user: int, deadline_s: float, max_tokens: int) -> AskOutcome:
        return self._run(ask_resuming(self.channel, spec, user, deadline_s, max_tokens))

    def close(self) -> None:
        self._run(self.channel.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


async def ask_resuming(channel, spec: AskSpec, user: int, deadline_s: float, max_tokens: int) -> AskOutcome:
    """One Ask read through ResumableAsk (as `streamrag ask` reads it), recorded; never raises for a failed
    call. Every call of it (the first and each re-issue) gets what is left of the ask's deadline."""
    import grpc

    from protos import common_pb2, orchestrator_pb2, orchestrator_pb2_grpc
    from servicekit.ask_resume import ResumableAsk

    stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
    request = orchestrator_pb2.AskRequest(question=spec.question, retriever=RETRIEVER_CHOICES[spec.retriever],
                                          no_stream=not spec.streamed, max_tokens=max_tokens)
    out = AskOutcome(user, spec, time.monotonic(), deadline_s=deadline_s)
    kinds: collections.Counter = collections.Counter()
    sources: set[str] = set()
    indexes: list[int] = []
    text = ""
    last = out.start                    # the last answer token's arrival (or the start)

    def call(ask_request):
        now = time.monotonic()
        if ask_request.HasField("resume"):      # the stream broke: ResumableAsk sends it again
            out.reissues.append(Reissue(now, len(indexes), round(now - last, 3)))
        return stub.Ask(ask_request, timeout=max(0.1, out.start + deadline_s - now))

    resumable = ResumableAsk(call, request)
    out.request_id = resumable.request_id
    try:
        async for response in resumable:
            event = response.event
            kind = event.WhichOneof("kind")
            if kind == "started":
                out.replica = event.started.replica
            elif kind == "retrieval":
                out.chunks += 1
                sources.add(event.retrieval.source)
            elif kind == "lifecycle":
                name = common_pb2.LifecycleEventKind.Name(event.lifecycle.kind)
                kinds[name.removeprefix("LIFECYCLE_EVENT_KIND_")] += 1
            elif kind == "token":
                now = time.monotonic()
                out.max_token_gap_s = max(out.max_token_gap_s, now - last)
                if out.reissues and out.reissues[-1].token_after_s is None:
                    out.reissues[-1].token_after_s = round(now - out.reissues[-1].at, 3)
                last = now
                indexes.append(event.token.index)
                text += event.token.text
            elif kind == "done":
                out.ok, out.answer, out.replica = True, event.done.answer, event.done.replica
                out.sources = tuple(d.id for d in event.done.sources)
        if not out.ok:
            out.code, out.detail = "NO_DONE", "the stream ended without done"
    except grpc.RpcError as exc:
        out.code, out.detail = exc.code().name, (exc.details() or "")[:300]
    out.end = time.monotonic()
    out.tokens = len(indexes)
    out.tokens_in_order = indexes == list(range(len(indexes))) and (not out.ok or text == out.answer)
    out.lifecycle, out.retrieved_from = dict(kinds), tuple(sorted(sources))
    return out


@dataclass
class Users:
    """`count` users asking from `specs` (each user starts at its own offset), thinking `think_s` between asks."""

    clients: Clients
    specs: list[AskSpec]
    count: int
    deadline_s: float
    max_tokens: int
    think_s: tuple[float, float] = (1.0, 3.0)
    seed: int = 0
    outcomes: list[AskOutcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.quit = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._user, args=(u,), name=f"chaos-user-{u}", daemon=True)
                        for u in range(self.count)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        """No new asks; wait for those in flight (each ends by its deadline)."""
        self.quit.set()
        for thread in self.threads:
            thread.join()

    def answered_since(self, t: float) -> bool:
        """Whether an ask started at or after monotonic `t` was answered."""
        with self.lock:
            return any(o.ok and o.start >= t for o in self.outcomes)

    def _user(self, user: int) -> None:
        rng = random.Random(self.seed * 1000 + user)
        step = max(1, len(self.specs) // max(1, self.count))
        i = user * step
        while not self.quit.is_set():
            outcome = self.clients.ask(self.specs[i % len(self.specs)], user, self.deadline_s, self.max_tokens)
            with self.lock:
                self.outcomes.append(outcome)
            i += 1
            self.quit.wait(rng.uniform(*self.think_s))


@dataclass
class RecoveryProbe:
    """After each fault, one prober asks a question that needs the faulted service (its retriever, or any
    ask) again and again, one ask at a time, until one is answered with that service's part: the start of
    that ask is when asks succeed again, untouched by how busy the users happen to be."""

    clients: Clients
    question: str
    deadline_s: float
    outcomes: list[AskOutcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.quit = threading.Event()
        self.threads: list[threading.Thread] = []

    def probe(self, record) -> None:
        """Start probing for a fault record (faults.FaultRecord); sets its `probe_ok` and `probe_answered`."""
        thread = threading.Thread(target=self._probe, args=(record,), name="chaos-probe", daemon=True)
        self.threads.append(thread)
        thread.start()

    def finish(self) -> None:
        self.quit.set()
        for thread in self.threads:
            thread.join()

    def _probe(self, record) -> None:
        target = record.plan.target
        spec = AskSpec(self.question, target if target in RETRIEVERS else "anns", True)
        while not self.quit.is_set():
            outcome = self.clients.ask(spec, -2, self.deadline_s, 1)
            self.outcomes.append(outcome)
            if outcome.ok and set(needs(spec)) <= set(outcome.retrieved_from):
                record.probe_ok, record.probe_answered = outcome.start, outcome.end
                return
            self.quit.wait(0.5)


def run_all(clients: Clients, specs: list[AskSpec], concurrency: int, deadline_s: float,
            max_tokens: int) -> list[AskOutcome]:
    """Each spec once, `concurrency` at a time (the fault-free reference pass)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda s: clients.ask(s, -1, deadline_s, max_tokens), specs))


@dataclass
class CallOutcome:
    what: str                          # "create", "ingest", "query", "close"
    start: float
    end: float = 0.0
    ok: bool = False
    code: str = ""
    detail: str = ""


@dataclass
class IngestingSession:
    """One session fed a small batch every `every_s` (and asked about it every few batches) through the
    orchestrator's Sessions service, each call waiting for an orchestrator it cannot reach yet (within its
    deadline); a session lost with its replica is created again."""

    address: str
    key: str | None
    tls: object = None                 # servicekit.tls.TlsFiles: dial with TLS (the stack's client certificate)
    every_s: float = 2.0
    deadline_s: float = 60.0
    calls: list[CallOutcome] = field(default_factory=list)
    session_id: str = ""

    def __post_init__(self) -> None:
        self.quit = threading.Event()
        self.thread = threading.Thread(target=self._run, name="chaos-session", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.quit.set()
        self.thread.join()

    def _call(self, what: str, fn) -> object | None:
        import grpc

        call = CallOutcome(what, time.monotonic())
        try:
            result = fn()
            call.ok = True
        except grpc.RpcError as exc:
            result, call.code, call.detail = None, exc.code().name, (exc.details() or "")[:300]
        call.end = time.monotonic()
        self.calls.append(call)
        return result

    def _run(self) -> None:
        import grpc

        from protos import common_pb2, sessions_pb2, sessions_pb2_grpc
        from protos.metadata import INGEST_AFTER_KEY
        from servicekit.session_reissue import ResumableQuery, reissued

        def create(attempt: int):
            """A re-issue that finds the session made is the first try's: it was created."""
            try:
                return stub.CreateSession(sessions_pb2.CreateSessionRequest(
                    session_id=self.session_id, instructions="Answer from the log lines below.",
                    retention_tokens=1024), timeout=self.deadline_s, wait_for_ready=True)
            except grpc.RpcError as exc:
                if not attempt or exc.code() is not grpc.StatusCode.ALREADY_EXISTS:
                    raise
                return stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=self.session_id),
                                            timeout=self.deadline_s, wait_for_ready=True)

        # Every call outlives the orchestrator serving it: re-issued to another (servicekit/session_reissue.py).
        with orchestrator_channel(self.address, self.key, self.tls) as channel:
            stub = sessions_pb2_grpc.SessionsStub(channel)
            batch, created, version = 0, False, 0
            while not self.quit.is_set():
                if not created:
                    self.session_id = f"chaos-{time.time_ns()}"
                    created = self._call("create", lambda: reissued(create, what="create")) is not None
                    version = 0
                else:
                    batch += 1
                    lines = [common_pb2.Segment(text=f"line {batch}.{j}: service check {batch * 4 + j} ok")
                             for j in range(4)]
                    request = sessions_pb2.IngestRequest(session_id=self.session_id, segments=lines)
                    ingested = self._call("ingest", lambda r=request, after=version: reissued(
                        lambda attempt: stub.Ingest(iter([r]), timeout=self.deadline_s, wait_for_ready=True,
                                                    metadata=((INGEST_AFTER_KEY, str(after)),) if attempt else ()),
                        what="ingest"))
                    version = ingested.data_version if ingested is not None else version
                    if batch % 5 == 0:
                        query = sessions_pb2.QueryRequest(session_id=self.session_id, question="Which check was last?",
                                                          sampling=common_pb2.SamplingParams(max_tokens=4))
                        self._call("query", lambda q=query: list(ResumableQuery(
                            lambda r: stub.Query(r, timeout=self.deadline_s, wait_for_ready=True), q)))
                    if self.calls[-1].code == "NOT_FOUND":
                        created = False
                self.quit.wait(self.every_s)
            if created:
                self._call("close", lambda: stub.CloseSession(sessions_pb2.CloseSessionRequest(
                    session_id=self.session_id), timeout=self.deadline_s))
