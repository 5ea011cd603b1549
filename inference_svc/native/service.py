"""The native Inference service: engine + engine thread + servicers + gRPC server, started and
stopped as one (`inference_svc.server` builds it from the flags; tests build it directly)."""

from __future__ import annotations

import contextlib

from inference_svc.engine.factory import EngineSpec, build_engine
from inference_svc.native.engine_thread import EngineThread
from inference_svc.native.metrics import StepMetrics
from inference_svc.native.servicer import NativeServicer
from inference_svc.native.sessions import SessionFormat, SessionManager
from inference_svc.native.sessions_servicer import SessionsServicer
from inference_svc.options import DEFAULT_MAX_SESSIONS, DEFAULT_MAX_STREAMS
from inference_svc.rpc.chat_format import chat_format
from inference_svc.rpc.metrics import InferenceMetrics
from inference_svc.rpc.servicer import SERVICE_NAME
from protos import inference_pb2, inference_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from servicekit.config import ServiceConfig
from servicekit.server import ServiceRunner

SESSIONS_SERVICE_NAME = sessions_pb2.DESCRIPTOR.services_by_name["Sessions"].full_name


class NativeInferenceService:
    """Serves `Inference` and `Sessions` on one engine (the same surface as `VllmInferenceService`)."""

    def __init__(self, spec: EngineSpec, config: ServiceConfig, max_streams: int = DEFAULT_MAX_STREAMS,
                 max_sessions: int = DEFAULT_MAX_SESSIONS):
        self.engine = build_engine(spec)
        self.metrics = InferenceMetrics()
        self.step_metrics = StepMetrics(self.metrics, model_name=spec.model_dir.name)
        self.thread = EngineThread(self.engine, self._after_step)
        runner = self.engine.runner
        info = inference_pb2.ModelInfo(
            model=spec.model_dir.name, context_length=self.engine.max_model_len, block_size=spec.engine.block_size,
            policy=self.engine.policy.name, backend="native", eviction_mode=spec.engine.eviction, dtype=spec.dtype,
            device=str(runner.device), chat_format=chat_format(self.engine.tokenizer.tokenizer, runner.eos_token_ids),
            vocab_size=runner.config.vocab_size, token_budget=spec.engine.token_budget)
        self.servicer = NativeServicer(self.thread, info, self.metrics, max_streams)
        chat = info.chat_format
        self.sessions = SessionManager(self.engine, SessionFormat(chat.prompt_prefix + chat.user_prefix,
                                                                  chat.user_suffix + chat.assistant_prefix),
                                       max_sessions=max_sessions)
        self.sessions_servicer = SessionsServicer(self.thread, self.sessions, self.metrics)
        servicers = [(inference_pb2_grpc.add_InferenceServicer_to_server, self.servicer),
                     (sessions_pb2_grpc.add_SessionsServicer_to_server, self.sessions_servicer)]
        self.runner = ServiceRunner(config, servicers,
                                    [SERVICE_NAME, SESSIONS_SERVICE_NAME], registry=self.metrics.registry)

    def _after_step(self, seconds: float | None, events: list) -> None:
        """On the engine thread, after a step (or a command that raised events)."""
        self.sessions.observe(seconds, events)
        self.step_metrics.observe(self.engine, seconds, events)
        self.metrics.sessions.set(len(self.sessions.sessions))
        self.servicer.publish_stats(self.engine, num_sessions=len(self.sessions.sessions))

    async def start(self, handle_signals: bool = True) -> int:
        self.servicer.publish_stats(self.engine)
        self.thread.start()
        return await self.runner.start(handle_signals=handle_signals)

    async def stop(self, grace_s: float | None = None) -> None:
        await self.runner.stop(grace_s)
        with contextlib.suppress(Exception):   # an engine that failed has nothing left to free
            await self.thread.call(lambda engine: self.sessions.close_all("service shutdown"))
        self.shutdown()

    def shutdown(self) -> None:
        self.thread.stop()
