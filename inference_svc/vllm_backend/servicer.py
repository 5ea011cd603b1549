"""The `Inference` servicer on vLLM: the native servicer's validation and plumbing
(`StreamServicerBase`), with each request driven by a `VllmRequest` on the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from inference_svc.convert import BadRequest, sampling_from_proto, segments_from_proto
from inference_svc.engine.engine import EngineInputError
from inference_svc.metrics import InferenceMetrics
from inference_svc.servicer import StreamServicerBase, next_stream_message, status_for
from inference_svc.vllm_backend.policy import priority_for
from inference_svc.vllm_backend.prompt import StreamedPrompt
from inference_svc.vllm_backend.session import VllmRequest
from inference_svc.vllm_backend.stats import StatsSource
from protos import inference_pb2


class VllmServicer(StreamServicerBase):
    def __init__(self, llm, new_prompt: Callable[[], StreamedPrompt], decode: Callable[[list[int]], str],
                 stats: StatsSource, model_info: inference_pb2.ModelInfo, metrics: InferenceMetrics,
                 max_streams: int = 256) -> None:
        super().__init__(model_info, metrics, max_streams)
        self.llm = llm
        self.new_prompt = new_prompt
        self.decode = decode
        self.stats = stats
        self._requests: dict[str, VllmRequest] = {}

    # --- RPCs -----------------------------------------------------------------------
    async def StreamPrompt(self, request_iterator, context) -> AsyncIterator[inference_pb2.StreamPromptResponse]:
        async with self._stream_slot(context):
            first = await self._first_message(request_iterator, context)
            arrived = time.monotonic()
            opening = first.update.open
            request_id = await self._admit(opening.request_id, context)
            try:
                segments = await self._parse(context, segments_from_proto, opening.segments)
                sampling = await self._parse(context, sampling_from_proto, opening.sampling,
                                             opening.HasField("sampling"))
                await self._check_policy_hint(opening.policy_hint, context)
                events: asyncio.Queue = asyncio.Queue()
                request = self._new_request(request_id, sampling, opening.priority, events, arrived)
                await self._apply(context, lambda: request.open(segments, arrived))
                reader = asyncio.create_task(self._read_rest(request_iterator, request, events))
                try:
                    async for event in self._pump(request_id, events, context):
                        yield inference_pb2.StreamPromptResponse(event=event)
                finally:
                    reader.cancel()
            finally:
                self._release(request_id)

    async def Generate(self, request, context) -> AsyncIterator[inference_pb2.GenerateResponse]:
        arrived = time.monotonic()
        async with self._stream_slot(context):
            request_id = await self._admit(request.request_id, context)
            try:
                segments = await self._parse(context, segments_from_proto, request.segments)
                sampling = await self._parse(context, sampling_from_proto, request.sampling,
                                             request.HasField("sampling"))
                await self._check_policy_hint(request.policy_hint, context)
                events: asyncio.Queue = asyncio.Queue()
                vllm_request = self._new_request(request_id, sampling, request.priority, events, arrived)

                def start() -> None:
                    vllm_request.open((), arrived)
                    vllm_request.finish(segments, arrived)

                await self._apply(context, start)
                async for event in self._pump(request_id, events, context):
                    yield inference_pb2.GenerateResponse(event=event)
            finally:
                self._release(request_id)

    async def GetStats(self, request, context) -> inference_pb2.GetStatsResponse:
        stats = self.stats.snapshot()
        stats.max_concurrent_streams = self.max_streams
        stats.num_active = len(self._active)
        return inference_pb2.GetStatsResponse(stats=stats)

    # --- helpers --------------------------------------------------------------------
    def _new_request(self, request_id: str, sampling, hint: int, events: asyncio.Queue,
                     arrived: float) -> VllmRequest:
        policy = self.model_info.policy
        request = VllmRequest(self.llm, request_id, self.new_prompt(), sampling,
                              lambda complete: priority_for(policy, hint, complete), events, self.decode, arrived,
                              self.stats.request_ended)
        self._requests[request_id] = request
        self.stats.request_received()
        return request

    async def _apply(self, context, fn: Callable[[], None]) -> None:
        try:
            fn()
        except EngineInputError as exc:
            error = status_for(exc)
            await self._abort(context, error.code, error.message)

    async def _read_rest(self, request_iterator, request: VllmRequest, events: asyncio.Queue) -> None:
        """Apply append/update/finish in arrival order; a violation ends the call via the queue."""
        finished = False
        try:
            async for message in request_iterator:
                arrived = time.monotonic()
                kind, segments = next_stream_message(message, finished)
                getattr(request, kind)(segments, arrived)
                finished = kind == "finish"
            if not finished:
                raise BadRequest("the client closed its stream before finish")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            events.put_nowait(status_for(exc))

    def _release(self, request_id: str) -> None:
        self._active.discard(request_id)
        request = self._requests.pop(request_id, None)
        if request is not None:
            if not request.finished:
                self.stats.request_aborted()
            request.close()
