"""A StreamPrompt call's client side, read so that the call's status always reaches the client.

gRPC's asyncio client loses the status of a bidirectional call that the server ends while the client
is still writing: its pending write fails first, and the call reads INTERNAL "Internal error from
Core" instead of the server's code. On the native backend 39 of 40 StreamPrompt calls opened with a
1 MiB request_id and followed by twenty 20 KB appends read INTERNAL, not INVALID_ARGUMENT; how often
depends only on timing, so each backend showed it in some runs. So before the servicer ends a
StreamPrompt call with a status, it reads and drops what the client is still sending (`drain`): up
to the client's half-close, while messages keep coming (a pause of `DRAIN_IDLE_S` means the client is
waiting, not writing), for at most `DRAIN_LIMIT_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable
from typing import Any

DRAIN_IDLE_S = 0.25     # no message for this long: the client is not writing
DRAIN_LIMIT_S = 5.0     # the most a refusal waits for a client that keeps writing


class ClientStream:
    """The client's messages of one call (an async iterator over them), noting when the last one came
    and when the client half-closed. One task reads at a time: `reader`, once the servicer has one."""

    def __init__(self, messages: AsyncIterable[Any]) -> None:
        self._messages = aiter(messages)
        self.ended = asyncio.Event()                 # half-closed, or broken: nothing more will come
        self.reader: asyncio.Task | None = None      # the task reading the rest of the call
        self._last_message = asyncio.get_running_loop().time()

    def __aiter__(self) -> ClientStream:
        return self

    async def __anext__(self) -> Any:
        try:
            message = await anext(self._messages)
        except StopAsyncIteration:
            self.ended.set()
            raise
        except asyncio.CancelledError:
            raise
        except Exception:
            self.ended.set()
            raise
        self._last_message = asyncio.get_running_loop().time()
        return message

    async def drain(self, idle_s: float = DRAIN_IDLE_S, limit_s: float = DRAIN_LIMIT_S) -> None:
        """Drop the client's messages until it half-closes or pauses for `idle_s`, for at most `limit_s`."""
        if self.ended.is_set():
            return
        loop = asyncio.get_running_loop()
        discarding = None if self.reader is not None and not self.reader.done() else asyncio.ensure_future(
            self._discard())
        deadline = loop.time() + limit_s
        try:
            while not self.ended.is_set():
                now = loop.time()
                quiet = now - self._last_message
                if quiet >= idle_s or now >= deadline:
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.ended.wait(), min(idle_s - quiet, deadline - now))
        finally:
            if discarding is not None:
                discarding.cancel()

    async def _discard(self) -> None:
        with contextlib.suppress(Exception):
            async for _ in self:
                pass
