"""The `Inference` servicer on vLLM: the RPCs of `StreamServicerBase`, with each request driven
by a `VllmRequest` on the event loop (the backend hook)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.options import DEFAULT_MAX_STREAMS
from inference_svc.rpc.metrics import InferenceMetrics
from inference_svc.rpc.servicer import StreamServicerBase
from inference_svc.rpc.tenancy import CURRENT_SHARE
from inference_svc.vllm_backend.prompt import StreamedPrompt
from inference_svc.vllm_backend.session import VllmRequest
from inference_svc.vllm_backend.stats import StatsSource
from protos import inference_pb2


class VllmServicer(StreamServicerBase):
    def __init__(self, llm, new_prompt: Callable[[], StreamedPrompt], decode: Callable[[list[int]], str],
                 stats: StatsSource, model_info: inference_pb2.ModelInfo, metrics: InferenceMetrics,
                 max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        super().__init__(model_info, metrics, max_streams)
        self.llm = llm
        self.new_prompt = new_prompt
        self.decode = decode
        self.stats = stats
        self._requests: dict[str, VllmRequest] = {}

    # --- the backend hook -------------------------------------------------------------
    async def _open(self, request_id: str, segments: list[Segment], sampling: SamplingParams, priority: int,
                    arrived: float, complete: bool) -> asyncio.Queue:
        events: asyncio.Queue = asyncio.Queue()
        # `priority` orders within the request's tenant under fair share (engine/fair_share.py), as natively
        request = VllmRequest(self.llm, request_id, self.new_prompt(), sampling, events,
                              self.decode, arrived, self.stats.request_ended)
        request.share, request.priority = CURRENT_SHARE.get(), priority
        try:
            if complete:
                request.open((), arrived)
                request.finish(segments, arrived)
            else:
                request.open(segments, arrived)
        except Exception:
            request.close()    # refused at open: no request, as on the native engine (rpc.stats)
            raise
        self._requests[request_id] = request
        self.stats.request_received()
        return events

    def _send(self, request_id: str, kind: str, segments: list[Segment], arrived: float,
              events: asyncio.Queue, final_stage: bool = True) -> None:
        """Applied at once, in arrival order; the prompt's checks raise before anything changes.
        `final_stage` (updates): unless set, only the stable prefix is submitted (`VllmRequest.update`)."""
        request = self._requests[request_id]
        if kind == "update":
            request.update(segments, arrived, final=final_stage)
        else:
            getattr(request, kind)(segments, arrived)

    def _close(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is not None:
            if not request.finished:
                self.stats.request_aborted(request.stats)
            request.close()

    def open_requests(self) -> list[VllmRequest]:
        return list(self._requests.values())

    def _engine_stats(self) -> inference_pb2.EngineStats:
        return self.stats.snapshot()
