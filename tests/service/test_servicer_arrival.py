"""A StreamPrompt message is timestamped when it arrives, not when the backend is ready for it.

The servicer reads a call's messages while the backend is still applying its `open` (the native
engine applies commands between steps, so that can take a whole step). A chunk sent together with
the open must count as arriving then: fcfs ranks complete prompts by when their last chunk
arrived, and a late stamp put a single-chunk query behind a prompt that completed after it
(docs/benchmarks.md, "Streaming never loses, session 12": anns-00028).

A backend double at the hook seam (`_open`, `_send`, `_close`), driven through `_serve` with an
in-process message stream; the real backends' streaming is tested in test_inference_streaming.py.
No timing: the double's `_open` waits until the stream's last message has been taken.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from inference_svc.engine.request import FinishReason, RequestStats
from inference_svc.rpc.metrics import InferenceMetrics
from inference_svc.rpc.servicer import StreamServicerBase
from inference_svc.rpc.summary import RequestSummary
from protos import common_pb2, inference_pb2


class Aborted(Exception):
    pass


class Context:
    async def abort(self, code, message):
        raise Aborted(f"{code.name}: {message}")

    def invocation_metadata(self):
        return ()


class Messages:
    """The client's messages after `open`, recording when the servicer takes each one."""

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        self.taken: dict[str, float] = {}
        self.all_taken = asyncio.Event()

    async def __aiter__(self):
        for kind in self.kinds:
            self.taken[kind] = time.monotonic()
            if kind == "update":
                body = inference_pb2.PromptUpdate(update=inference_pb2.PromptReplace(
                    segments=[common_pb2.Segment(text="a document")], final_stage=True))
            else:
                body = inference_pb2.PromptUpdate(finish=inference_pb2.PromptFinish())
            yield inference_pb2.StreamPromptRequest(update=body)
        self.all_taken.set()


class SlowOpenBackend(StreamServicerBase):
    """`_open` returns only once every later message was taken from the stream (a backend busy for
    a step); a servicer that read them only after the open would never get there."""

    def __init__(self, messages: Messages) -> None:
        super().__init__(inference_pb2.ModelInfo(), InferenceMetrics())
        self.messages = messages
        self.opened_at: float | None = None
        self.sent: dict[str, float] = {}

    async def _open(self, request_id, segments, sampling, priority, arrived, complete):
        try:
            await asyncio.wait_for(self.messages.all_taken.wait(), timeout=60)
        except TimeoutError:
            raise AssertionError("the servicer read nothing while the backend applied open") from None
        self.opened_at = time.monotonic()
        self.events: asyncio.Queue = asyncio.Queue()
        return self.events

    def _send(self, request_id, kind, segments, arrived, events, final_stage=True):
        self.sent[kind] = arrived
        if kind == "finish":
            events.put_nowait(RequestSummary(request_id, FinishReason.LENGTH, RequestStats(), 0, (), ""))

    def _close(self, request_id):
        pass


@pytest.mark.asyncio
async def test_messages_sent_with_the_open_are_stamped_on_arrival_not_when_the_backend_is_ready():
    messages = Messages(["update", "finish"])
    servicer = SlowOpenBackend(messages)
    opening = inference_pb2.PromptOpen(request_id="q", segments=[common_pb2.Segment(text="head")])
    events = [e async for e in servicer._serve(opening, time.monotonic(), Context(), messages)]
    assert events and events[-1].WhichOneof("kind") == "done"
    assert set(servicer.sent) == {"update", "finish"}
    for kind, arrived in servicer.sent.items():
        assert messages.taken[kind] <= arrived <= servicer.opened_at, f"{kind} stamped after the open was applied"


@pytest.mark.asyncio
async def test_a_stream_that_ends_before_finish_is_still_refused():
    messages = Messages(["update"])
    servicer = SlowOpenBackend(messages)
    opening = inference_pb2.PromptOpen(request_id="q")
    with pytest.raises(Aborted, match="INVALID_ARGUMENT: the client closed its stream before finish"):
        async for _ in servicer._serve(opening, time.monotonic(), Context(), messages):
            pass
