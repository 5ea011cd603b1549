"""What the soak checks once the load has drained and every service is back.

- Leaked blocks: the soak's sessions are closed, then every replica's pools are read (GetStats)
  until free == total on each (aborts free blocks asynchronously), or `wait_s` passes; what is
  still held then is leaked.
- Lost lifecycle events: for every ask a client was acknowledged (it got `done`), the stored
  record (GetRequest) must exist, be FINISHED with the same answer, and hold at least as many
  events of each lifecycle kind as the client saw, one RETRIEVAL_CHUNK per chunk the client saw,
  and a DONE. Every shortfall is counted, per ask.
- Resumes: the same read collects each ask's CONTINUED events (an answer continued after a break:
  the tokens it continued after, the KV computed again, the break to its first token) and
  RESUMED events (an orchestrator took over an Ask the client re-issued).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from load_tests.chaos.workload import AskOutcome, orchestrator_channel


def close_sessions(address: str, key: str | None, prefix: str = "chaos-", tls=None) -> list[str]:
    """Close every session whose id starts with `prefix`; returns their ids. (`tls`: as orchestrator_channel's.)"""
    import grpc

    from protos import sessions_pb2, sessions_pb2_grpc

    closed = []
    with orchestrator_channel(address, key, tls) as channel:
        stub = sessions_pb2_grpc.SessionsStub(channel)
        try:
            listed = stub.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=30).sessions
        except grpc.RpcError:
            return closed
        for info in listed:
            if info.session_id.startswith(prefix):
                try:
                    stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id=info.session_id), timeout=30)
                    closed.append(info.session_id)
                except grpc.RpcError:
                    pass
    return closed


def leaked_blocks(stack, wait_s: float = 60.0) -> dict[str, dict]:
    """Per replica the blocks still held once free == total everywhere or `wait_s` passed: {"held": {pool:
    blocks}, and what holds them: "sessions", "running", "waiting", "swapped"} ("held" empty: none)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = {}
        for replica in stack.replicas:
            try:
                stats = stack.replica_stats(replica)
            except Exception as exc:          # a replica that does not answer: its blocks are unknown
                found[replica.name] = {"held": {"unreadable": -1}, "error": str(exc)[:200]}
                continue
            held = {pool: total - free for pool, (free, total) in stats.pop("pools").items() if free != total}
            found[replica.name] = {"held": held, **stats}
        if not any(r["held"] for r in found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(1.0)


@dataclass
class LostEvents:
    request_id: str
    t_end: float                                  # monotonic: when the client got done
    missing: dict[str, int] = field(default_factory=dict)   # what is short: kind -> count, "record", "state"...
    code: str = ""                                # why the record could not be read ("unreadable")

    @property
    def count(self) -> int:
        return sum(n for kind, n in self.missing.items() if kind != "unreadable")


def expected_events(ask: AskOutcome) -> collections.Counter:
    expected = collections.Counter(ask.lifecycle)
    expected["RETRIEVAL_CHUNK"] += ask.chunks
    expected["DONE"] += 1
    return expected


RESUME_KINDS = ("CONTINUED", "RESUMED")


def lost_events(address: str, key: str | None, asks: list[AskOutcome], settle_s: float = 30.0,
                continued: dict[str, list[dict]] | None = None, tls=None) -> list[LostEvents]:
    """Compare what each acknowledged ask's client saw with the store; one entry per ask with a shortfall.
    A record not yet FINISHED is read again for up to `settle_s` (the store writes behind). `continued`,
    when given, gets each ask's resume events ({request id: [{"kind", "unix_ms", fields...}]}). `tls`: as
    orchestrator_channel's."""
    import grpc

    from protos import orchestrator_pb2, orchestrator_pb2_grpc

    lost = []
    deadline = time.monotonic() + settle_s
    with orchestrator_channel(address, key, tls) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        for ask in (a for a in asks if a.ok and a.request_id):
            unreadable_code = ""
            while True:
                missing: dict[str, int] = {}
                try:
                    record = stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=ask.request_id),
                                             timeout=30).record
                except grpc.RpcError as exc:
                    record = None
                    if exc.code() == grpc.StatusCode.NOT_FOUND:
                        missing = {"record": 1, **expected_events(ask)}
                    else:                               # the store did not answer: unknown, not lost
                        missing = {"unreadable": 1}
                        unreadable_code = exc.code().name
                if record is not None:
                    if record.state != orchestrator_pb2.REQUEST_STATE_FINISHED:
                        missing["state"] = 1
                    if record.answer != ask.answer:
                        missing["answer"] = 1
                    stored = collections.Counter(e.kind for e in record.events)
                    if continued is not None:
                        continued[ask.request_id] = [{"kind": e.kind, "unix_ms": e.unix_ms, **dict(e.fields)}
                                                     for e in record.events if e.kind in RESUME_KINDS]
                    for kind, count in expected_events(ask).items():
                        if stored[kind] < count:
                            missing[kind] = count - stored[kind]
                if not missing or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            if missing:
                lost.append(LostEvents(ask.request_id, ask.end, missing,
                                       unreadable_code if "unreadable" in missing else ""))
    return lost
