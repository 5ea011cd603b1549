"""The world the fault and tenant tests hold answers in: Redis, a replay retriever (when a test asks with
a trace), and one fp32 replica of the embedded model behind an `InferenceGate` (inference_gate.py), each
a real server on loopback. A test adds its orchestrators with `world.parts.add(...)`; everything is
stopped in reverse order of starting when the `with` block ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from retriever_svc.replay.backend import ReplayBackend
from retriever_svc.replay.trace import Trace
from tests.support.inference import RunningInference
from tests.support.inference_gate import InferenceGate
from tests.support.redis_server import PrivateRedis
from tests.support.retrievers import RunningRetriever

T = TypeVar("T")


class Parts:
    """Services (anything with `stop()`), stopped in the reverse of the order they were added."""

    def __init__(self) -> None:
        self._parts: list[Any] = []

    def add(self, part: T) -> T:
        self._parts.append(part)
        return part

    def stop(self) -> None:
        for part in reversed(self._parts):
            part.stop()
        self._parts.clear()


@dataclass
class GatedWorld:
    parts: Parts
    redis: Any                          # PrivateRedis, or what `redis` built (a SentinelSet): has `url`
    replica: RunningInference
    gate: InferenceGate
    retriever: RunningRetriever | None  # the trace's replay retriever ("files"), when a trace was given


@contextmanager
def gated_world(model_dir: Path, root: Path, *, trace: Trace | None = None,
                redis: Callable[[Path], Any] = PrivateRedis) -> Iterator[GatedWorld]:
    parts = Parts()
    try:
        store = parts.add(redis(root))
        retriever = parts.add(RunningRetriever(ReplayBackend(trace, name="files"), "replay")) if trace else None
        replica = parts.add(RunningInference(model_dir, kv_device_blocks=128, token_budget=256))
        gate = parts.add(InferenceGate(replica.address))
        yield GatedWorld(parts, store, replica, gate, retriever)
    finally:
        parts.stop()
