"""Stateful sessions (the paper "Attention Once Is All You Need", sections 3.3-3.9): long-lived KV
over a growing context, queries that fork it, and Flash Queries answered ahead of time.

A session is three regions of one prompt (`SessionFormat`):
- the frozen head: the chat prefix and the instructions;
- the data region: every retained data segment, in arrival order;
- the query region: a query's question and the assistant header, on a fork.

Head and data are one engine request that never finishes, the session's *state*. Ingestion
appends to it and it is prefilled in the INGEST scheduling class as batches arrive. Each ingest
batch is one data version. A query forks the state at the latest version whose data is prefilled
(`Engine.fork`): full blocks are shared and the last, partly filled block is copied, so the query
computes only its question, never the retained window (the paper's queries run "against the
latest processed state"). A caller that needs newer data asks for a `min_version`; the query then
also computes the data not prefilled yet.

Retention: past `retention_tokens` of data the oldest segments are dropped. Dropping from the
front moves every later token to a new position, and with rotary embeddings a token's KV depends
on its position, so the kept window is prefilled again: a new state request (head + kept window)
opens in the INGEST class and takes the later batches, while queries keep using the old state
and report its version. Once the new state has computed its window it replaces the old one,
which is aborted (blocks that running queries still share stay until those queries end).

Flash Queries: once the latest version is fully prefilled, each registered question whose
answer is older is evaluated on a fork in the BACKGROUND class (only capacity the rest leaves).
Its answer, confidence (the smallest logit gap over its tokens) and version are cached and
pushed to subscribers. A query whose normalized text matches a registered question that has an
answer for the version the query would see is answered from that cache without the engine:
`flash_answer` may be called from any thread; everything else runs on the engine thread, with
`observe` after every step and command.

Fair share (engine/fair_share.py): a session is its creator's tenant's (the `Share` given to `create`).
Its state requests (ingestion, a retention rebuild) and its Flash evaluations are charged to that tenant
and ranked among its requests; a query is charged to the tenant that asks it (its `Share`), like any
Generate. So a tenant's session work counts against its share, and a flood of another tenant's
queries or ingestion does not hold its queries back.

The manager is the Sessions service's logic, not engine: it drives the engine through its public
calls (open, append, fork, abort) and owns no KV (the scheduler owns every block, a session's too).
The errors it raises are in `rpc.errors`, beside their statuses.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inference_svc.engine.engine import Engine, EngineInputError
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.fair_share import NO_SHARE, Share
from inference_svc.engine.request import FinishReason, RequestState, SchedClass, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.options import DEFAULT_MAX_SESSIONS
from inference_svc.rpc.errors import SessionError, SessionExists, SessionLimit, SessionNotFound

log = logging.getLogger(__name__)

DATA_HEADER = "\n\nData:\n"
QUERY_ROOM_TOKENS = 512          # what the default retention leaves for a question and its answer
DEFAULT_FLASH_MAX_TOKENS = 64
MAX_FLASH_QUERIES = 32           # per session
_STATE_SAMPLING = SamplingParams(max_tokens=1, speculation="off")   # the state never decodes


def normalize_question(question: str) -> str:
    """The Flash Query match key: case and whitespace folded."""
    return " ".join(question.split()).casefold()


@dataclass(frozen=True)
class SessionFormat:
    """Where instructions, data and a question go in the served model's chat format."""

    head_prefix: str = ""        # before the instructions (chat prefix + user prefix)
    query_suffix: str = "\n"     # after the question (user suffix + assistant header)

    def head(self, instructions: str) -> Segment:
        return Segment(text=self.head_prefix + instructions + DATA_HEADER, key="instructions")

    @staticmethod
    def data(segment: Segment) -> Segment:
        """A data segment as the session stores it: text ends with a newline."""
        if segment.text is not None and not segment.text.endswith("\n"):
            return Segment(text=segment.text + "\n", key=segment.key)
        return segment

    def query(self, question: str) -> Segment:
        return Segment(text=f"Question: {question}" + self.query_suffix)


@dataclass(frozen=True)
class FlashAnswer:
    question: str
    answer: str
    confidence: float
    data_version: int
    eval_ms: float                 # from the batch's ingest to the answer


@dataclass(frozen=True)
class DataUpdated:
    data_version: int
    data_tokens: int
    dropped_segments: int


@dataclass(frozen=True)
class SessionClosed:
    reason: str


SessionEvent = FlashAnswer | DataUpdated | SessionClosed


@dataclass(frozen=True)
class QueryPlan:
    """How `SessionManager.query` answers: from the Flash cache, or by the forked request."""

    data_version: int
    request_id: str | None = None          # the forked request (None: a Flash hit)
    flash: FlashAnswer | None = None
    context_tokens: int = 0                # head + data tokens the query sees
    shared_tokens: int = 0                 # of those, KV shared with the session


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    instructions: str
    data_version: int
    head_tokens: int
    data_tokens: int
    computed_tokens: int
    retention_tokens: int
    segments: int
    dropped_segments: int
    flash_questions: tuple[str, ...]
    state: str
    active_queries: int


@dataclass
class _Entry:
    version: int
    segment: Segment
    tokens: int


def _end(version_end: tuple[int, int]) -> int:
    return version_end[1]


@dataclass
class _State:
    """An engine request holding head + data up to its latest version."""

    request_id: str
    ready_tokens: int = 0          # a rebuild replaces the old state once it has computed these
    # (version, prompt tokens up to the end of that version's data), oldest first
    ends: list[tuple[int, int]] = field(default_factory=list)

    @property
    def version(self) -> int:
        return self.ends[-1][0]

    def hold(self, version: int, prompt_tokens: int) -> None:
        self.ends.append((version, prompt_tokens))


@dataclass
class _Flash:
    question: str
    max_tokens: int
    answer: FlashAnswer | None = None
    running: str | None = None     # the evaluating request
    running_version: int = -1


@dataclass
class Session:
    session_id: str
    instructions: str
    retention_tokens: int
    head: Segment
    head_tokens: int
    state: _State
    window: deque[_Entry] = field(default_factory=deque)
    data_tokens: int = 0
    version: int = 0
    dropped_segments: int = 0
    rebuild: _State | None = None
    flash: dict[str, _Flash] = field(default_factory=dict)     # normalized question -> entry
    queries: set[str] = field(default_factory=set)
    share: Share = NO_SHARE                 # its tenant: its state and Flash requests are charged to it
    ingested_at: dict[int, float] = field(default_factory=dict)  # version -> when (for eval_ms)
    serial: int = 0

    def visible(self, requests: dict, min_version: int = 0) -> tuple[_State, int, int]:
        """What a query sees: (state, data version, prompt tokens of that version). The latest
        version whose data is prefilled (the paper's "latest processed state": the query computes
        only its question), or, when the caller needs newer data (`min_version`) or nothing is
        prefilled yet, the latest version (the query computes the data not prefilled yet)."""
        state = self.state
        request = requests[state.request_id]
        computed = request.num_computed_tokens if request.state is RequestState.RUNNING else 0
        ready = bisect_right(state.ends, computed, key=_end)     # the versions whose data is prefilled
        if ready and state.ends[ready - 1][0] >= min_version:
            return state, *state.ends[ready - 1]
        if self.rebuild is not None and min_version > state.version:
            state = self.rebuild
        return state, *state.ends[-1]

    def next_id(self, kind: str) -> str:
        self.serial += 1
        return f"session:{self.session_id}:{kind}:{self.serial}"


class SessionManager:
    """Every session of one engine. Engine-thread only, except `flash_answer` and `exists`."""

    def __init__(self, engine: Engine, fmt: SessionFormat = SessionFormat(),
                 notify: Callable[[str, SessionEvent], None] = lambda session_id, event: None,
                 max_sessions: int = DEFAULT_MAX_SESSIONS, query_room_tokens: int = QUERY_ROOM_TOKENS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.fmt = fmt
        self.notify = notify
        self.max_sessions = max_sessions
        self.query_room_tokens = query_room_tokens
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self._owners: dict[str, tuple[Session, str]] = {}   # request id -> (session, "query" | normalized question)

    # --- any thread -------------------------------------------------------------------
    def exists(self, session_id: str) -> bool:
        return session_id in self.sessions

    def flash_answer(self, session_id: str, question: str, min_version: int = 0) -> FlashAnswer | None:
        """The cached answer a query of `question` would get now, if it is for the version the query sees."""
        session = self.sessions.get(session_id)
        if session is None:
            return None
        entry = session.flash.get(normalize_question(question))
        answer = entry.answer if entry is not None else None
        if answer is None:
            return None
        try:
            visible = session.visible(self.engine.requests, min_version)[1]
        except KeyError:      # another thread: the state was just replaced; the engine thread will tell
            return None
        return answer if answer.data_version == visible else None

    # --- engine thread: calls -------------------------------------------------------------
    def create(self, session_id: str, instructions: str, retention_tokens: int = 0,
               share: Share = NO_SHARE) -> SessionInfo:
        """A new session of `share`'s tenant (see the module doc)."""
        if session_id in self.sessions:
            raise SessionExists(f"session {session_id!r} already exists")
        if len(self.sessions) >= self.max_sessions:
            raise SessionLimit(f"too many sessions (limit {self.max_sessions})")
        if retention_tokens < 0:
            raise SessionError("retention_tokens must be >= 0")
        head = self.fmt.head(instructions)
        head_tokens = len(self.engine.tokenizer.encode(head))
        room = self.engine.max_sequence_tokens - 1 - head_tokens - self.query_room_tokens
        retention = retention_tokens or room
        if retention > room or retention < 1:
            raise SessionLimit(f"no room: {head_tokens} head tokens + {retention} retained data tokens + "
                               f"{self.query_room_tokens} for a query exceed the {self.engine.max_sequence_tokens} "
                               "tokens a sequence can hold")
        reserved = sum(s.head_tokens + s.retention_tokens for s in self.sessions.values())
        pools = self.engine.scheduler.pools()
        capacity = sum(pool.num_blocks for pool in pools) * self.engine.scheduler.block_size
        if reserved + head_tokens + retention > capacity:
            raise SessionLimit(f"no room: the open sessions reserve {reserved} of the {capacity} tokens the KV "
                               f"pools hold; this one needs {head_tokens + retention}")
        state = _State(f"session:{session_id}:state:0")
        request = self.engine.open(state.request_id, [head], _STATE_SAMPLING, sched_class=SchedClass.INGEST,
                                   share=share)
        state.hold(0, request.num_prompt_tokens)
        session = Session(session_id, instructions, retention, head, head_tokens, state, share=share)
        self.sessions[session_id] = session
        return self.describe(session_id)

    def ingest(self, session_id: str, segments: Sequence[Segment]) -> int:
        """One batch: a new data version. Returns it."""
        session = self._get(session_id)
        if not segments:
            raise SessionError("an ingest batch needs at least one segment")
        if any(not (segment.text.strip() if segment.text is not None else segment.token_ids) for segment in segments):
            raise SessionError("a data segment is empty")
        data = [self.fmt.data(segment) for segment in segments]
        entries = []
        for segment in data:
            tokens = len(self.engine.tokenizer.encode(segment))
            if tokens > session.retention_tokens:
                raise SessionError(f"a data segment of {tokens} tokens exceeds the session's retention of "
                                   f"{session.retention_tokens} tokens")
            entries.append(_Entry(session.version + 1, segment, tokens))
        session.version += 1
        session.ingested_at[session.version] = self.clock()
        session.window.extend(entries)
        session.data_tokens += sum(entry.tokens for entry in entries)
        dropped = 0
        while session.data_tokens > session.retention_tokens:
            session.data_tokens -= session.window.popleft().tokens
            dropped += 1
        if dropped:
            session.dropped_segments += dropped
            self._start_rebuild(session)
        else:
            target = session.rebuild or session.state
            self.engine.append(target.request_id, data)
            target.hold(session.version, self.engine.requests[target.request_id].num_prompt_tokens)
        self.notify(session_id, DataUpdated(session.version, session.data_tokens, session.dropped_segments))
        return session.version

    def query(self, session_id: str, question: str, sampling: SamplingParams, request_id: str,
              min_version: int = 0, share: Share = NO_SHARE, priority: int = 0) -> QueryPlan:
        """Answer from the latest prefilled data version, or from version `min_version` or newer
        (then the query also computes the data not prefilled yet). `share`: the asking tenant's;
        `priority`: its place among that tenant's requests (lower sooner)."""
        session = self._get(session_id)
        if not question.strip():
            raise SessionError("the question is empty")
        if not 0 <= min_version <= session.version:
            raise SessionError(f"min_data_version {min_version} is not in [0, {session.version}] (the latest version)")
        flash = self.flash_answer(session_id, question, min_version)
        if flash is not None:
            return QueryPlan(flash.data_version, flash=flash)
        state, version, context = session.visible(self.engine.requests, min_version)
        child = self.engine.fork(request_id, state.request_id, context, [self.fmt.query(question)], sampling,
                                 track_confidence=sampling.greedy, share=share, priority=priority)
        session.queries.add(request_id)
        self._owners[request_id] = (session, "query")
        return QueryPlan(version, request_id, context_tokens=context, shared_tokens=child.num_computed_tokens)

    def register(self, session_id: str, question: str, max_tokens: int = 0) -> list[str]:
        session = self._get(session_id)
        key = normalize_question(question)
        if not key:
            raise SessionError("the question is empty")
        if max_tokens < 0:
            raise SessionError("max_tokens must be >= 0")
        if key not in session.flash:
            if len(session.flash) >= MAX_FLASH_QUERIES:
                raise SessionLimit(f"too many Flash Queries (limit {MAX_FLASH_QUERIES} per session)")
            session.flash[key] = _Flash(question.strip(), max_tokens or DEFAULT_FLASH_MAX_TOKENS)
        self._evaluate_flash(session)
        return [entry.question for entry in session.flash.values()]

    def unregister(self, session_id: str, question: str) -> list[str]:
        session = self._get(session_id)
        entry = session.flash.pop(normalize_question(question), None)
        if entry is None:
            raise SessionError(f"no Flash Query {question!r} in session {session_id!r}")
        if entry.running is not None:
            self.engine.abort(entry.running)
        return [entry.question for entry in session.flash.values()]

    def close(self, session_id: str, reason: str = "closed by a client") -> SessionInfo:
        """Abort everything the session runs (its queries end ABORT) and free its KV."""
        info = self.describe(session_id)
        session = self.sessions.pop(session_id)
        for request_id in [*session.queries, *(f.running for f in session.flash.values() if f.running),
                           session.state.request_id, *([session.rebuild.request_id] if session.rebuild else [])]:
            self.engine.abort(request_id)
        self.notify(session_id, SessionClosed(reason))
        return info

    def close_all(self, reason: str) -> None:
        for session_id in list(self.sessions):
            self.close(session_id, reason)

    def current_answers(self, session_id: str) -> list[FlashAnswer]:
        """The Flash answers for the version queries see now."""
        session = self._get(session_id)
        return [answer for entry in session.flash.values()
                if (answer := self.flash_answer(session_id, entry.question)) is not None]

    def describe(self, session_id: str) -> SessionInfo:
        session = self._get(session_id)
        state = self.engine.requests[session.state.request_id]
        if session.rebuild is not None:
            phase = "rebuilding"
        elif state.state is RequestState.SWAPPED:
            phase = "swapped"
        elif state.num_computed_tokens < state.num_prompt_tokens:
            phase = "ingesting"
        else:
            phase = "ready"
        computed = state.num_computed_tokens if state.state is not RequestState.SWAPPED else 0
        return SessionInfo(session.session_id, session.instructions, session.version, session.head_tokens,
                           session.data_tokens, computed, session.retention_tokens, len(session.window),
                           session.dropped_segments, tuple(f.question for f in session.flash.values()), phase,
                           len(session.queries))

    def list(self) -> list[SessionInfo]:
        return [self.describe(session_id) for session_id in self.sessions]

    # --- engine thread: after every step and command ----------------------------------
    def observe(self, seconds: float | None, events: list[EngineEvent]) -> None:
        for event in events:
            if event.kind is EventKind.FINISHED and event.request_id in self._owners:
                self._ended(event.request_id)
        for session in self.sessions.values():
            rebuild = session.rebuild
            if rebuild is not None and self.engine.requests[rebuild.request_id].num_computed_tokens >= \
                    rebuild.ready_tokens:
                self.engine.abort(session.state.request_id)
                session.state, session.rebuild = rebuild, None
            self._evaluate_flash(session)

    # --- internals ------------------------------------------------------------------
    def _get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id!r}")
        return session

    def _start_rebuild(self, session: Session) -> None:
        """Prefill head + the kept window again in a new state request (see the module doc)."""
        if session.rebuild is not None:
            self.engine.abort(session.rebuild.request_id)
        request_id = session.next_id("state")
        segments = [session.head, *(entry.segment for entry in session.window)]
        request = self.engine.open(request_id, segments, _STATE_SAMPLING, sched_class=SchedClass.INGEST,
                                   share=session.share)
        session.rebuild = _State(request_id, ready_tokens=request.num_prompt_tokens)
        session.rebuild.hold(session.version, request.num_prompt_tokens)

    def _evaluate_flash(self, session: Session) -> None:
        """Start evaluating stale Flash answers once the query state is fully prefilled."""
        state = session.state
        if not session.flash or state.version == 0:      # no data yet: nothing to answer about
            return
        parent = self.engine.requests[state.request_id]
        if parent.state is not RequestState.RUNNING or parent.num_computed_tokens < parent.num_prompt_tokens:
            return
        for key, entry in session.flash.items():
            current = entry.answer is not None and entry.answer.data_version == state.version
            if current or entry.running_version == state.version:
                continue
            if entry.running is not None:
                self.engine.abort(entry.running)     # evaluating an older version
            request_id = session.next_id("flash")
            sampling = SamplingParams(max_tokens=entry.max_tokens, speculation="off")
            entry.running, entry.running_version = None, state.version   # also when it cannot start
            try:
                self.engine.fork(request_id, state.request_id, parent.num_prompt_tokens,
                                 [self.fmt.query(entry.question)], sampling, SchedClass.BACKGROUND,
                                 track_confidence=True, share=session.share)
            except EngineInputError as exc:      # e.g. the question no longer fits beside the data
                log.warning("session %s: Flash Query %r not evaluated: %s", session.session_id, entry.question, exc)
                continue
            entry.running = request_id
            self._owners[request_id] = (session, key)

    def _ended(self, request_id: str) -> None:
        session, role = self._owners.pop(request_id)
        if role == "query":
            session.queries.discard(request_id)
            return
        entry = session.flash.get(role)
        if entry is None or entry.running != request_id:
            return
        version = entry.running_version
        entry.running, entry.running_version = None, -1
        request = self.engine.requests.get(request_id)
        if request is None or request.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
            return
        started = session.ingested_at.get(version, request.arrival_time)
        entry.answer = FlashAnswer(entry.question, request.output_text, request.min_logit_gap or 0.0, version,
                                   (self.clock() - started) * 1e3)
        for old in [v for v in session.ingested_at if v < version]:
            del session.ingested_at[old]
        if self.sessions.get(session.session_id) is session:
            self.notify(session.session_id, entry.answer)
