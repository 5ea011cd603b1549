"""The stack runner: many services at once, in this process or as `streamrag up` runs them.

- `Stack(model_dir, root)`: the whole stack in this process (a private Redis, the tiny corpus over
  HTTP, the ANNS (with live collections under `root/collections`), crawler and replay retrievers, a
  real replica (fp32) and the orchestrator), every service built by its runner on one shared loop.
- `replicas_behind_an_orchestrator(model_dir, root, roles)`: N replicas (a role each: None for the
  plain native service, or prefill/decode/both) behind an orchestrator over a private Redis.
- `streamrag up` as a subprocess stack: `streamrag(...)` runs the console script; the `run_dir`
  fixture gives a run directory and stops whatever a failed test left running there. `up` itself
  waits until every service is healthy (the launcher's own check: gRPC health SERVING, the gateway's
  `/health`), so the rule is the same one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from protos import orchestrator_pb2
from retriever_svc.anns.backend import AnnsBackend
from retriever_svc.anns.index import AnnsIndex
from retriever_svc.collections.registry import CollectionRegistry, DefaultCollection
from retriever_svc.corpus.web_server import CorpusServer
from retriever_svc.crawler import CrawlerBackend, CrawlerSettings
from retriever_svc.replay.backend import ReplayBackend
from retriever_svc.replay.trace import Trace, TraceChunk, TraceDocument, TraceQuery
from streamrag.stack import processes, state
from tests.support.inference import RunningInference
from tests.support.orchestrator import RunningOrchestrator
from tests.support.redis_server import PrivateRedis
from tests.support.retrievers import RunningRetriever
from tests.support.serving import LoopThread

# A replay stream that sends one document now and the rest much later: long enough to kill
# the retriever in between.
SLOW_TRACE = Trace((TraceQuery("slow", "how do files work", "crawler", "synthesized", (
    TraceChunk(0.0, "append", False, (TraceDocument("r1", "Files", "http://x/files.html",
                                                    "Use open() to read a file."),)),
    TraceChunk(60.0, "append", True, (TraceDocument("r2", "Later", "http://x/later.html", "Too late."),)),
)),))


class Stack:
    """Everything started is stopped by `stop()`, even when set-up fails half-way."""

    def __init__(self, model_dir: Path, root: Path) -> None:
        from tests.retriever import build_tiny_index

        self.root = root
        self.redis = self.corpus = self.inference = self.orchestrator = None
        self.retrievers: dict[str, RunningRetriever] = {}
        self.host = LoopThread("e2e-stack")
        try:
            self.redis = PrivateRedis(root, persist=True)
            self.index_dir = build_tiny_index(root)
            self.corpus = CorpusServer(root=root / "site", port=0)
            self.corpus.start()
            self.inference = RunningInference(model_dir, kv_device_blocks=256, token_budget=256, policy="fcfs")
            self.serve_retriever("anns", AnnsBackend(CollectionRegistry(
                root / "collections", DefaultCollection(AnnsIndex(self.index_dir)))))
            self.serve_retriever("crawler", CrawlerBackend(CrawlerSettings(
                start_urls=(self.corpus.index_url,), max_pages=10, work_dir=root / "crawl")))
            self.serve_retriever("replay", ReplayBackend(SLOW_TRACE, name="slow"))
            self.retriever_addresses = {name: r.address for name, r in self.retrievers.items()}
            self.orchestrator = self.orchestrate()
        except BaseException:
            self.stop()          # whatever did start: no process outlives a failed set-up
            raise
        self.orchestrator_port = self.orchestrator.port
        self.stub = self.orchestrator.stub

    def run(self, coro, timeout_s: float = 120):
        return self.host.run(coro, timeout_s)

    def serve_retriever(self, name: str, backend) -> str:
        """Serve one more retriever beside the stack's (stopped with it); its address."""
        self.retrievers[name] = RunningRetriever(backend, name, host=self.host)
        return self.retrievers[name].address

    def orchestrate(self, retrievers: dict[str, str] | None = None, **options) -> RunningOrchestrator:
        """Another orchestrator over the stack's Redis and replica (the caller stops it); `retrievers`
        default the stack's; `**options`: `RunningOrchestrator` keywords (api_keys, tls, client_tls)."""
        return RunningOrchestrator(self.redis.url, [self.inference.address],
                                   self.retriever_addresses if retrievers is None else retrievers,
                                   host=self.host, **options)

    def stop_retriever(self, name: str) -> None:
        self.retrievers[name].stop()

    def stop(self) -> None:
        if self.orchestrator is not None:
            self.orchestrator.stop()
        for retriever in self.retrievers.values():
            retriever.stop()
        self.host.close()
        for part in (self.inference, self.corpus, self.redis):
            if part is not None:
                part.stop()


def ask(stub, question: str, retriever: int = orchestrator_pb2.RETRIEVER_CHOICE_ANNS, *, no_stream: bool = False,
        max_tokens: int = 12, **fields) -> tuple[list, orchestrator_pb2.AskDone | None]:
    request = orchestrator_pb2.AskRequest(question=question, retriever=retriever, no_stream=no_stream,
                                          max_tokens=max_tokens, **fields)
    events = [response.event for response in stub.Ask(request, timeout=180)]
    done = events[-1].done if events and events[-1].WhichOneof("kind") == "done" else None
    return events, done


# --- replicas behind an orchestrator ------------------------------------------------------------------
@dataclass
class Orchestrated:
    orchestrator: RunningOrchestrator
    replicas: list[RunningInference]
    redis: PrivateRedis

    @property
    def stub(self):
        return self.orchestrator.stub


@contextlib.contextmanager
def replicas_behind_an_orchestrator(model_dir: Path, root: Path, roles: tuple[str | None, ...] = (None, None), *,
                                    router_refresh_s: float = 1.0, **replica_options) -> Iterator[Orchestrated]:
    """One replica per role (kv_device_blocks=128, token_budget=256 unless given), in that order, behind an
    orchestrator with no retrievers; everything started is stopped, even if set-up fails."""
    options = {"kv_device_blocks": 128, "token_budget": 256, **replica_options}
    redis = PrivateRedis(root)
    replicas: list[RunningInference] = []
    orchestrator = None
    try:
        replicas.extend(RunningInference(model_dir, role=role, **options) for role in roles)
        orchestrator = RunningOrchestrator(redis.url, [r.address for r in replicas], router_refresh_s=router_refresh_s)
        yield Orchestrated(orchestrator, replicas, redis)
    finally:
        if orchestrator is not None:
            orchestrator.stop()
        for replica in replicas:
            replica.stop()
        redis.stop()


# --- `streamrag up` as processes ------------------------------------------------------------------------
STREAMRAG = Path(sys.executable).with_name("streamrag")


def streamrag(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The console script, as a user runs it (offline)."""
    return subprocess.run([str(STREAMRAG), *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))


def processes_in(run_dir: Path) -> list[int]:
    """Live processes whose working directory is `run_dir` (every service `up` starts runs there)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")) == run_dir and processes.process_start_ticks(int(proc.name)):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def stop_what_is_left(run_dir: Path) -> None:
    """SIGKILL the supervisor first (it would start services again), then every process running in
    `run_dir`, each woken first (SIGCONT to its group: a test may have frozen it)."""
    recorded = state.read_state(run_dir)
    if recorded is not None and recorded.supervisor is not None and processes.is_running(recorded.supervisor):
        os.kill(recorded.supervisor.pid, signal.SIGKILL)
    for pid in processes_in(run_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run directory for `streamrag up`; whatever a test left running there is stopped afterwards."""
    directory = (tmp_path / "run").resolve()
    yield directory
    stop_what_is_left(directory)
