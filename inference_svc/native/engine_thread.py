"""Run the engine on its own thread so RPC handling and engine steps never stall each other.

The gRPC handlers (on the asyncio event loop) submit commands — open, append, update,
finish, abort, stats — and await their futures; the engine thread applies them between
steps, steps while there is work, and hands each request's events to that request's
`asyncio.Queue` with `call_soon_threadsafe`. When a request ends, a `RequestSummary`
follows its FINISHED event and the engine forgets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from inference_svc.engine.engine import Engine
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.rpc.summary import RequestSummary

log = logging.getLogger(__name__)


# Called on the engine thread: (step seconds, or None for events raised by commands; events).
StepObserver = Callable[[float | None, list[EngineEvent]], None]


class EngineThread:
    def __init__(self, engine: Engine, on_step: StepObserver | None = None, idle_wait_s: float = 0.05) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._subscribers: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._on_step = on_step
        self._idle_wait_s = idle_wait_s
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.fatal_error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._commands.put((lambda: None, Future()))   # wake the thread
        self._thread.join(timeout)

    # --- called from the event loop -------------------------------------------------
    def subscribe(self, request_id: str) -> asyncio.Queue:
        events: asyncio.Queue = asyncio.Queue()
        with self._lock:
            self._subscribers[request_id] = (asyncio.get_running_loop(), events)
        return events

    def unsubscribe(self, request_id: str) -> None:
        with self._lock:
            self._subscribers.pop(request_id, None)

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Run `fn(engine)` on the engine thread between steps; its exception is raised here."""
        return await self.submit(fn)

    def submit(self, fn: Callable[[Engine], Any]) -> asyncio.Future:
        """Queue `fn(engine)` without waiting: commands run in submission order, and several
        that arrive while a step runs are applied together before the next step."""
        if self.fatal_error is not None:
            raise RuntimeError(f"engine stopped after an internal error: {self.fatal_error}")
        future: Future = Future()
        self._commands.put((lambda: fn(self.engine), future))
        return asyncio.wrap_future(future)

    def post(self, fn: Callable[[Engine], Any]) -> None:
        """Queue `fn(engine)` and do not wait (no event loop needed): it runs between steps, in
        submission order with the other commands; nobody sees its result."""
        self._commands.put((lambda: fn(self.engine), Future()))

    def abort_soon(self, request_id: str) -> None:
        """Fire-and-forget abort (from cancellation paths that cannot await). It is applied as soon as
        the step in flight ends: the request finishes and its blocks are free before the next step
        (with steps bounded in time, `EngineConfig.step_time_target_ms`, that is one short step)."""
        self.post(lambda engine: engine.abort(request_id))

    # --- the engine thread ----------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        stalled = False
        while not self._stop.is_set():
            # Wait for a command when idle, or when the last step could run nothing (a request
            # waiting on memory that only another request's progress or abort will free).
            self._apply_commands(block=stalled or not engine.has_work())
            if self._stop.is_set():
                break
            try:
                if engine.has_work():
                    started = time.perf_counter()
                    events = engine.step()
                    elapsed = time.perf_counter() - started
                    stalled = engine.last_step.tokens == 0 and not events
                    if self._on_step is not None:   # before dispatch: a caller told "done" sees fresh stats
                        self._on_step(elapsed, events)
                    self._dispatch(events)
            except Exception as exc:   # a bug, not bad input: fail every request, keep the process up
                log.exception("engine step failed")
                self.fatal_error = exc
                self._fail_all(exc)
                return

    def _apply_commands(self, block: bool) -> None:
        try:
            fn, future = self._commands.get(timeout=self._idle_wait_s) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)
            events = self.engine.take_events()
            if events and self._on_step is not None:
                self._on_step(None, events)
            self._dispatch(events)
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return

    def _dispatch(self, events: list[EngineEvent]) -> None:
        for event in events:
            self._deliver(event.request_id, event)
            if event.kind is EventKind.FINISHED:
                request = self.engine.release(event.request_id)
                if request is not None:
                    self._deliver(event.request_id, RequestSummary(
                        request.request_id, request.finish_reason, request.stats, request.num_prompt_tokens,
                        tuple(request.output_token_ids), request.output_text, request.min_logit_gap))

    def _deliver(self, request_id: str, item: Any) -> None:
        with self._lock:
            target = self._subscribers.get(request_id)
        if target is not None:
            loop, events = target
            with contextlib.suppress(RuntimeError):   # a closed loop: nobody is listening any more
                loop.call_soon_threadsafe(events.put_nowait, item)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            targets = list(self._subscribers.values())
        for loop, events in targets:
            loop.call_soon_threadsafe(events.put_nowait, exc)
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError(f"engine stopped: {exc}"))
