"""The whole stack in one test process: a private Redis, the tiny corpus served over HTTP, the
ANNS (with live collections under `root/collections`), crawler and replay retrievers, a real
inference replica (fp32) and the orchestrator, each a real gRPC server on loopback."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc

from orchestrator.server import OrchestratorService
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from retriever_svc.anns.backend import AnnsBackend
from retriever_svc.anns.index import AnnsIndex
from retriever_svc.collections.registry import CollectionRegistry, DefaultCollection
from retriever_svc.corpus.web_server import CorpusServer
from retriever_svc.crawler import CrawlerBackend, CrawlerSettings
from retriever_svc.replay import ReplayBackend
from retriever_svc.server import build_runner
from retriever_svc.trace import Trace, TraceChunk, TraceDocument, TraceQuery
from servicekit.config import ServiceConfig
from servicekit.server import ServiceRunner
from tests.retriever import build_tiny_index
from tests.service.inference_harness import RunningInference
from tests.support.redis_server import PrivateRedis

# A replay stream that sends one document now and the rest much later: long enough to kill
# the retriever in between.
SLOW_TRACE = Trace((TraceQuery("slow", "how do files work", "crawler", "synthesized", (
    TraceChunk(0.0, "append", False, (TraceDocument("r1", "Files", "http://x/files.html",
                                                    "Use open() to read a file."),)),
    TraceChunk(60.0, "append", True, (TraceDocument("r2", "Later", "http://x/later.html", "Too late."),)),
)),))


class Stack:
    def __init__(self, model_dir: Path, root: Path) -> None:
        self.root = root
        self.redis = self.corpus = self.inference = self.orchestrator = self.channel = None
        self.retrievers: dict[str, ServiceRunner] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="e2e-stack", daemon=True)
        self.thread.start()
        try:
            self.redis = PrivateRedis(root, persist=True)
            self.index_dir = build_tiny_index(root)
            self.corpus = CorpusServer(root=root / "site", port=0)
            self.corpus.start()
            self.inference = RunningInference(model_dir, kv_device_blocks=256, token_budget=256, policy="fcfs")
            self._run(self._start())
        except BaseException:
            self.stop()          # whatever did start: no process outlives a failed set-up
            raise
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.orchestrator_port}")
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(self.channel)

    def _run(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _serve_retriever(self, name: str, backend) -> str:
        runner, _ = build_runner(ServiceConfig(service=name, port=0, metrics_port=None, grace_s=0), backend)
        port = await runner.start(handle_signals=False)
        self.retrievers[name] = runner
        return f"127.0.0.1:{port}"

    async def _start(self) -> None:
        self.retriever_addresses = addresses = {
            "anns": await self._serve_retriever("anns", AnnsBackend(CollectionRegistry(
                self.root / "collections", DefaultCollection(AnnsIndex(self.index_dir))))),
            "crawler": await self._serve_retriever("crawler", CrawlerBackend(CrawlerSettings(
                start_urls=(self.corpus.index_url,), max_pages=10, work_dir=self.root / "crawl"))),
            "replay": await self._serve_retriever("replay", ReplayBackend(SLOW_TRACE, name="slow")),
        }
        self.orchestrator = OrchestratorService(ServiceConfig("orchestrator", port=0, metrics_port=None, grace_s=0),
                                                redis_url=self.redis.url, inference=[self.inference.address],
                                                retrievers=addresses)
        self.orchestrator_port = await self.orchestrator.start(handle_signals=False)

    def stop_retriever(self, name: str) -> None:
        self._run(self.retrievers[name].stop(0))

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.orchestrator is not None:
            self._run(self.orchestrator.stop(0))
        for runner in self.retrievers.values():
            self._run(runner.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
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

