"""`streamrag serve inference`: the Inference gRPC service over the native engine."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path

from inference_svc.chat_format import chat_format
from inference_svc.engine.engine import EngineConfig
from inference_svc.engine.factory import EngineSpec, build_engine
from inference_svc.engine.options import DEFAULT_BLOCK_SIZE, DEFAULT_EVICTION, DEFAULT_MAX_SESSIONS
from inference_svc.engine.sessions import SessionFormat, SessionManager
from inference_svc.engine_thread import EngineThread
from inference_svc.metrics import InferenceMetrics
from inference_svc.servicer import InferenceServicer
from inference_svc.sessions_servicer import SessionsServicer
from protos import inference_pb2, inference_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from servicekit.config import ServiceConfig, service_config_from_args
from servicekit.server import ServiceRunner, configure_logging

log = logging.getLogger(__name__)
SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
SESSIONS_SERVICE_NAME = sessions_pb2.DESCRIPTOR.services_by_name["Sessions"].full_name


def engine_spec_from_args(args: argparse.Namespace) -> EngineSpec:
    model_dir = checked_model_dir(args)
    return EngineSpec(
        model_dir=model_dir, device=args.device, dtype=args.dtype, kv_device_blocks=args.kv_device_blocks,
        kv_device_bytes=args.kv_device_bytes, kv_cpu_blocks=args.kv_cpu_blocks,
        engine=EngineConfig(block_size=args.block_size or DEFAULT_BLOCK_SIZE, token_budget=args.token_budget,
                            max_running=args.max_running, policy=args.policy,
                            eviction=args.eviction or DEFAULT_EVICTION, policy_options=policy_options(args),
                            speculative_share=args.speculative_share,
                            speculative_reserve_share=args.speculative_reserve_share,
                            speculative_append_share=args.speculative_append_share))


def policy_options(args: argparse.Namespace) -> dict:
    """Options of the chosen policy from the flags (both backends)."""
    starvation_s = getattr(args, "lcas_starvation_s", None)
    return {"starvation_s": starvation_s} if args.policy == "lcas" and starvation_s is not None else {}


def checked_model_dir(args: argparse.Namespace) -> Path:
    """Check the numeric flags and the model directory (the embedded model by default)."""
    from inference_svc.embedded_model import prepare_embedded_model

    for name in ("kv_device_blocks", "kv_device_bytes", "kv_cpu_blocks", "token_budget", "max_running", "max_streams",
                 "block_size"):
        value = getattr(args, name, None)
        if value is not None and value < (0 if name == "kv_cpu_blocks" else 1):
            raise SystemExit(f"error: --{name.replace('_', '-')} must be positive, got {value}")
    model_dir = args.model or prepare_embedded_model(progress=False)
    if not (Path(model_dir) / "config.json").exists():
        raise SystemExit(f"error: {model_dir} is not a model directory (no config.json)")
    return Path(model_dir)


class InferenceService:
    """Engine + engine thread + servicer + gRPC server: start/stop as one unit (also used by tests)."""

    def __init__(self, spec: EngineSpec, config: ServiceConfig, max_streams: int = 256, backend: str = "native",
                 max_sessions: int = DEFAULT_MAX_SESSIONS):
        self.engine = build_engine(spec)
        self.metrics = InferenceMetrics()
        self.thread = EngineThread(self.engine, self._after_step)
        runner = self.engine.runner
        info = inference_pb2.ModelInfo(
            model=spec.model_dir.name, context_length=self.engine.max_model_len, block_size=spec.engine.block_size,
            policy=self.engine.policy.name, backend=backend, eviction_mode=spec.engine.eviction, dtype=spec.dtype,
            device=str(runner.device), chat_format=chat_format(self.engine.tokenizer.tokenizer, runner.eos_token_ids),
            vocab_size=runner.config.vocab_size, token_budget=spec.engine.token_budget)
        self.servicer = InferenceServicer(self.thread, info, self.metrics, max_streams)
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
        self.metrics.observe(self.engine, seconds, events)
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


async def serve(args: argparse.Namespace) -> None:
    configure_logging(args.log_level)
    config = service_config_from_args("inference", args)
    if args.backend == "vllm":
        from inference_svc.vllm_backend.launch import build_vllm_service  # imports vllm: only on this path

        service = build_vllm_service(args, checked_model_dir(args), config)
    else:
        service = InferenceService(engine_spec_from_args(args), config, args.max_streams, args.backend,
                                   args.max_sessions)
    port = await service.start()
    print(f"inference service on {args.host}:{port} (metrics :{service.runner.metrics_port})", flush=True)
    await service.runner.wait()
    service.shutdown()


def main(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    import sys

    from inference_svc.server_args import add_inference_args
    from servicekit.config import run_command

    sys.exit(run_command("python -m inference_svc.server", add_inference_args, main))
