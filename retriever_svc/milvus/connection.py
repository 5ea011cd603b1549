"""A Milvus deployment as the retriever sees it: where it is, which index it builds, how long a call may take.

The same settings point at the embedded server, Milvus Standalone or a cluster's proxy: only
the URI changes. Every call goes through `call`, the one place a Milvus failure (down,
restarting, slower than the timeout) becomes `RetrieverUnavailable` with the URI in it, so
the Retrieve stream ends UNAVAILABLE and the orchestrator answers with the other
retriever's context.

Index type `auto` is DISKANN except on the embedded server (`milvus` 2.3.5 from PyPI, which
reports a `-lite` version): its Knowhere library is built without DiskANN (no DiskANN
symbols in `libknowhere.so`; building one fails with `bad_function_call` and the index
coordinator retries it forever, so `create_index` never returns). There it is HNSW.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from retriever_svc.service import RetrieverUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

INDEX_TYPES = ("auto", "DISKANN", "HNSW")
DEFAULT_TIMEOUT_S = 5.0          # one search or write; past it the retrieval ends UNAVAILABLE
CONNECT_TIMEOUT_S = 10.0
CALL_THREADS = 16                 # Milvus calls in flight at once per connection
HNSW_BUILD = {"M": 16, "efConstruction": 200}
_aliases = itertools.count()


@dataclass(frozen=True)
class MilvusSettings:
    uri: str                              # http://host:19530 (embedded, Standalone, or a cluster's proxy)
    index_type: str = "auto"
    timeout_s: float = DEFAULT_TIMEOUT_S
    token: str = ""                       # user:password or an API key, where the deployment wants one


def max_search_list(index_type: str, k: int) -> int:
    """The largest candidate list Milvus accepts for top-k (DISKANN: 200 for k <= 20, else 10k; HNSW ef: 32768)."""
    if index_type == "DISKANN":
        return 200 if k <= 20 else min(10 * k, 65535)
    return 32768


def search_params(index_type: str, size: int) -> dict:
    key = "search_list" if index_type == "DISKANN" else "ef"
    return {"metric_type": "IP", "params": {key: int(size)}}


def index_params(index_type: str) -> dict:
    return {"index_type": index_type, "metric_type": "IP", "params": {} if index_type == "DISKANN" else HNSW_BUILD}


class MilvusConnection:
    """One pymilvus connection (its own alias) and the index type it builds."""

    def __init__(self, settings: MilvusSettings) -> None:
        if settings.index_type not in INDEX_TYPES:
            raise ValueError(f"--milvus-index must be one of {', '.join(INDEX_TYPES)}, got {settings.index_type!r}")
        if settings.timeout_s <= 0:
            raise ValueError(f"--milvus-timeout must be positive, got {settings.timeout_s}")
        self.settings = settings
        self.alias = f"streamrag-{next(_aliases)}"
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="milvus")
        self._connected = False
        self.server_version = ""
        self.index_type = "" if settings.index_type == "auto" else settings.index_type

    @property
    def uri(self) -> str:
        return self.settings.uri

    def connect(self) -> MilvusConnection:
        """Connect (again, after a failure) and settle the index type; RetrieverUnavailable when Milvus is down."""
        from pymilvus import connections, utility

        with self._lock:
            if self._connected:
                return self
            def open_():
                connections.connect(self.alias, uri=self.settings.uri, token=self.settings.token,
                                    timeout=CONNECT_TIMEOUT_S)
                return utility.get_server_version(using=self.alias, timeout=CONNECT_TIMEOUT_S)
            self.server_version = self._translate(open_, "connecting")
            if not self.index_type:
                self.index_type = "HNSW" if self.server_version.endswith("-lite") else "DISKANN"
            self._connected = True
            log.info("Milvus %s at %s: %s index", self.server_version, self.settings.uri, self.index_type)
        return self

    def call(self, what: str, function: Callable[[], T], timeout_s: float | None = None) -> T:
        """Run one Milvus call; any Milvus or transport failure, or no answer within `timeout_s` (default: the
        settings' for a search, four times it for a write), becomes RetrieverUnavailable.

        pymilvus retries a call to a server that went away for much longer than the timeout it is given,
        so the wait is bounded here: the call runs in a worker thread and is abandoned past the limit."""
        self.connect()
        limit = timeout_s or self.settings.timeout_s * 4
        future = self._pool.submit(self._translate, function, what)
        try:
            return future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RetrieverUnavailable(f"Milvus at {self.settings.uri} did not answer {what} within {limit:g} s") \
                from None

    def _translate(self, function: Callable[[], T], what: str) -> T:
        import grpc
        from pymilvus import MilvusException

        try:
            return function()
        except (MilvusException, grpc.RpcError, ConnectionError, TimeoutError) as exc:
            message = getattr(exc, "message", "") or str(exc)
            raise RetrieverUnavailable(f"Milvus at {self.settings.uri} failed {what}: {message}") from exc

    def close(self) -> None:
        from pymilvus import connections

        with self._lock:
            if self._connected:
                connections.disconnect(self.alias)
                self._connected = False
