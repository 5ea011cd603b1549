"""A crawl on its own event loop in a daemon thread, its kept pages streamed to the caller's loop.

Parsing large pages then never stalls the gRPC server, and stopping the crawl (client gone,
deadline, `top_k` reached) cancels the crawl task on its loop: in-flight fetches are cancelled
and no new one starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from protos import common_pb2
from retriever_svc.crawler.crawl import crawl_documents
from retriever_svc.crawler.settings import CrawlerSettings
from retriever_svc.crawler.url_policy import UrlPolicy
from retriever_svc.service import RetrieverUnavailable

log = logging.getLogger(__name__)

_END = object()


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable, *args: object) -> None:
    """Schedule `callback` on another thread's loop; a loop that has closed is ignored."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


class CrawlThread:
    """One crawl on its own event loop in a daemon thread; documents arrive on the caller's loop.

    A crawl that fails with `RetrieverUnavailable` (the search could not answer) hands the
    error to the caller: `next_document` raises it."""

    def __init__(self, settings: CrawlerSettings, policy: UrlPolicy, query: str) -> None:
        self.settings, self.policy, self.query = settings, policy, query
        self._caller = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._finished = self._caller.create_future()
        self._lock = threading.Lock()
        self._cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread = threading.Thread(target=self._run, name=f"crawl-{id(self):x}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def next_document(self) -> common_pb2.Document | None:
        """The next kept page, or None when the crawl has ended."""
        item = await self._queue.get()
        if isinstance(item, RetrieverUnavailable):
            raise item
        return None if item is _END else item

    async def stop(self) -> None:
        """Cancel the crawl (if still running) and wait, up to `stop_timeout_s`, for its thread to end."""
        with self._lock:
            self._cancelled = True
            if self._loop is not None:
                _call_soon(self._loop, self._cancel_crawl)
        try:
            await asyncio.wait_for(asyncio.shield(self._finished), self.settings.stop_timeout_s)
        except TimeoutError:
            log.warning("crawl for %r still stopping after %.1f s", self.query, self.settings.stop_timeout_s)

    def _cancel_crawl(self) -> None:
        """On the crawl's loop: cancel its task, again every 50 ms until it ends.

        Python 3.11's `asyncio.wait_for` drops a cancellation that lands as its inner future
        completes, and crawl4ai calls it in loops while fetching.
        """
        if self._task is not None and not self._task.done():
            self._task.cancel()
            asyncio.get_running_loop().call_later(0.05, self._cancel_crawl)

    def _post(self, item: object) -> None:
        _call_soon(self._caller, self._queue.put_nowait, item)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except asyncio.CancelledError:
            pass
        except RetrieverUnavailable as exc:
            log.warning("crawl for %r: %s", self.query, exc)
            self._post(exc)
        except Exception:
            log.exception("crawl for %r failed", self.query)
        finally:
            self._post(_END)
            _call_soon(self._caller, self._mark_finished)

    def _mark_finished(self) -> None:
        if not self._finished.done():
            self._finished.set_result(None)

    async def _main(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        counts = await crawl_documents(self.settings, self.policy, self.query, self._post)
        log.info("crawl for %r: %s", self.query, counts)
