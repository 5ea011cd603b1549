"""The `Inference` servicer on the native engine: the RPCs of `StreamServicerBase`, with the
backend hook sending each command to the engine thread, and the GetStats snapshot that the
engine thread publishes after every step."""

from __future__ import annotations

import asyncio
from functools import partial

from inference_svc.engine.engine import Engine
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.native.engine_thread import EngineThread
from inference_svc.options import DEFAULT_MAX_STREAMS
from inference_svc.rpc.errors import status_for
from inference_svc.rpc.metrics import InferenceMetrics
from inference_svc.rpc.servicer import StreamServicerBase
from inference_svc.rpc.stats import counters_to_proto
from inference_svc.rpc.tenancy import CURRENT_SHARE
from protos import inference_pb2


class NativeServicer(StreamServicerBase):
    """The native engine's servicer: commands go to the engine thread."""

    def __init__(self, engine_thread: EngineThread, model_info: inference_pb2.ModelInfo,
                 metrics: InferenceMetrics, max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        super().__init__(model_info, metrics, max_streams)
        self.engine_thread = engine_thread
        self._stats = inference_pb2.EngineStats()

    # --- the backend hook -------------------------------------------------------------
    async def _open(self, request_id: str, segments: list[Segment], sampling: SamplingParams, priority: int,
                    arrived: float, complete: bool) -> asyncio.Queue:
        """Queued without waiting for the engine, like `_send`: the messages that follow the open are
        queued right behind it, so an open, its only chunk and the finish are applied before the same
        step (waiting here cost a streamed single-chunk query a step that Generate did not pay).
        A refusal reaches the call through `events`."""
        events = self.engine_thread.subscribe(request_id)
        share = CURRENT_SHARE.get()              # the call's tenant (rpc/tenancy.py), read on this loop

        def start(engine: Engine) -> None:
            engine.open(request_id, segments, sampling, priority, arrived_at=arrived, share=share)
            if complete:   # in the same command: no step sees the prompt as partial
                try:
                    engine.finish(request_id, arrived_at=arrived)
                except Exception:
                    engine.abort(request_id)
                    engine.release(request_id)
                    raise

        self._submit(start, events)
        return events

    def _send(self, request_id: str, kind: str, segments: list[Segment], arrived: float,
              events: asyncio.Queue, final_stage: bool = True) -> None:
        action = {"append": Engine.append, "update": partial(Engine.update, final=final_stage),
                  "finish": Engine.finish}[kind]
        self._submit(lambda e: action(e, request_id, segments, arrived_at=arrived), events)

    def _submit(self, fn, events: asyncio.Queue) -> None:
        """Queue an engine command; its error, if any, ends the call through `events`."""

        def report(future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is not None:
                events.put_nowait(status_for(future.exception()))

        self.engine_thread.submit(fn).add_done_callback(report)

    def _close(self, request_id: str) -> None:
        """Abort the request if it is still in the engine (frees its blocks at the next step)."""
        self.engine_thread.unsubscribe(request_id)
        self.engine_thread.abort_soon(request_id)

    def _engine_stats(self) -> inference_pb2.EngineStats:
        return self._stats

    # --- stats ----------------------------------------------------------------------
    def publish_stats(self, engine: Engine, num_sessions: int = 0) -> None:
        """Called on the engine thread (or before it starts); replaces the snapshot atomically."""
        self._stats = self._snapshot(engine, num_sessions)

    def _snapshot(self, engine: Engine, num_sessions: int) -> inference_pb2.EngineStats:
        states = [r.state.value for r in engine.requests.values()]
        return inference_pb2.EngineStats(
            pools=[inference_pb2.BlockPoolStats(name=pool.name, total_blocks=pool.num_blocks,
                                                free_blocks=pool.num_free, block_size=engine.scheduler.block_size,
                                                bytes_per_block=getattr(engine.runner, "bytes_per_block", 0))
                   for pool in engine.scheduler.pools()],
            num_running=states.count("running"), num_waiting=states.count("waiting"),
            num_swapped=states.count("swapped"), policy=engine.policy.name,
            token_budget=engine.scheduler.token_budget, model=self.model_info.model, num_sessions=num_sessions,
            counters=counters_to_proto(engine.counters),   # the one mapping, shared with vLLM (rpc.stats)
        )
