"""One Milvus collection of passage vectors: (pid INT64 primary key, vector FLOAT_VECTOR[EMBEDDING_DIM]), metric IP.

Searches run at a growing candidate list size, as the diskannpy backend does (`stages.staged`):
DISKANN's `search_list` or HNSW's `ef`, each stage one Milvus search, raised to at least k and
capped at what Milvus accepts. Scores are inner products of unit vectors; they are returned as
squared L2 distances (2 - 2 ip) like every other index here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np

from retriever_svc.corpus.embedding import EMBEDDING_DIM
from retriever_svc.milvus.connection import MilvusConnection, index_params, max_search_list, search_params
from retriever_svc.stages import Stage, staged

PID, VECTOR = "pid", "vector"
WRITE_BATCH = 2000            # rows per insert call (a gRPC message stays well under Milvus's limits)
QUERY_WINDOW = 10_000         # pids per reconcile query (Milvus returns at most 16,384 rows per query)
# Milvus's Bounded consistency sees every write older than its graceful time (5 s by default) and costs
# nothing; Strong sees every write but waits for the next time tick (about 0.2-0.3 s a search here). Searches
# within this long of this process's last write to the collection are Strong, so an acknowledged add or
# remove is what the next search sees (with Session consistency, Milvus 2.3.5 still returned a row deleted just before).
STRONG_AFTER_WRITE_S = 10.0


class MilvusIndex:
    """A Milvus collection, created (with its index, loaded) on first use."""

    def __init__(self, connection: MilvusConnection, name: str) -> None:
        self.connection = connection
        self.name = name
        self._collection = None
        self._last_write = float("-inf")

    def consistency(self) -> str:
        return "Strong" if time.monotonic() - self._last_write < STRONG_AFTER_WRITE_S else "Bounded"

    @property
    def index_type(self) -> str:
        return self.connection.index_type

    def collection(self):
        """The pymilvus Collection, created, indexed and loaded if it is not yet."""
        if self._collection is None:
            self._collection = self.connection.call(f"opening collection {self.name}", self._open,
                                                    self.connection.settings.timeout_s * 40)
        return self._collection

    def _open(self):
        from pymilvus import Collection, CollectionSchema, DataType, FieldSchema, utility

        alias, timeout = self.connection.alias, self.connection.settings.timeout_s * 6
        if utility.has_collection(self.name, using=alias, timeout=timeout):
            collection = Collection(self.name, using=alias)
        else:
            schema = CollectionSchema([FieldSchema(PID, DataType.INT64, is_primary=True),
                                       FieldSchema(VECTOR, DataType.FLOAT_VECTOR, dim=EMBEDDING_DIM)],
                                      description="streamrag passages")
            collection = Collection(self.name, schema, using=alias, consistency_level="Bounded", timeout=timeout)
        if not collection.has_index(timeout=timeout):
            # On an empty collection this returns at once; sealed segments are indexed as they come.
            collection.create_index(VECTOR, index_params(self.index_type), timeout=timeout)
        collection.load(timeout=timeout * 5)
        return collection

    # ---- searching ----
    def search(self, vector: np.ndarray, k: int, search_list_size: int) -> tuple[list[int], list[float]]:
        size = min(max(search_list_size, k), max_search_list(self.index_type, k))
        collection = self.collection()
        timeout = self.connection.settings.timeout_s
        consistency = self.consistency()

        def run():
            return collection.search([np.asarray(vector, dtype=np.float32).tolist()], VECTOR,
                                     search_params(self.index_type, size), limit=k, timeout=timeout,
                                     consistency_level=consistency)[0]
        hits = self.connection.call(f"searching {self.name}", run, timeout)
        return [int(hit.id) for hit in hits], [max(0.0, 2.0 - 2.0 * float(hit.distance)) for hit in hits]

    def stages(self, vector: np.ndarray, k: int, schedule: Sequence[int]) -> Iterator[Stage]:
        """The staged search: sizes past Milvus's cap are searched once, at the cap."""
        cap = max_search_list(self.index_type, k)
        capped = sorted({min(max(size, k), cap) for size in schedule})
        return staged(lambda v, kk, size: self.search(v, kk, size), vector, k, capped)

    # ---- writing ----
    def insert(self, pids: Sequence[int], vectors: np.ndarray) -> None:
        collection = self.collection()
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, EMBEDDING_DIM)
        timeout = self.connection.settings.timeout_s * 4
        self._last_write = time.monotonic()
        for start in range(0, len(pids), WRITE_BATCH):
            rows = [[int(p) for p in pids[start:start + WRITE_BATCH]], vectors[start:start + WRITE_BATCH]]
            self.connection.call(f"inserting into {self.name}", lambda r=rows: collection.insert(r, timeout=timeout))

    def delete(self, pids: Sequence[int]) -> None:
        collection = self.collection()
        timeout = self.connection.settings.timeout_s * 4
        pids = [int(p) for p in pids]
        self._last_write = time.monotonic()
        for start in range(0, len(pids), WRITE_BATCH):
            expr = f"{PID} in {pids[start:start + WRITE_BATCH]}"
            self.connection.call(f"deleting from {self.name}", lambda e=expr: collection.delete(e, timeout=timeout))

    def flush(self) -> None:
        """Seal the growing segments, so that the index is built over them."""
        collection = self.collection()
        timeout = self.connection.settings.timeout_s * 12
        self.connection.call(f"flushing {self.name}", lambda: collection.flush(timeout=timeout), timeout + 1)

    def count(self) -> int:
        collection = self.collection()
        rows = self.connection.call(f"counting {self.name}", lambda: collection.query(
            expr="", output_fields=["count(*)"], consistency_level="Strong",
            timeout=self.connection.settings.timeout_s * 4))
        return int(rows[0]["count(*)"])

    def present(self, low: int, high: int) -> set[int]:
        """The pids in [low, high) Milvus holds."""
        collection = self.collection()
        rows = self.connection.call(f"reading {self.name}", lambda: collection.query(
            expr=f"{PID} >= {int(low)} and {PID} < {int(high)}", output_fields=[PID], consistency_level="Strong",
            limit=16_384, timeout=self.connection.settings.timeout_s * 4))
        return {int(row[PID]) for row in rows}

    def reconcile(self, pids: np.ndarray, vectors_of, top: int) -> tuple[int, int]:
        """Make Milvus hold exactly `pids` (every one at most `top`): insert the missing ones (`vectors_of(pids)`),
        delete the extra ones. Returns (inserted, deleted)."""
        want = set(pids.tolist())
        missing: list[int] = []
        extra: list[int] = []
        for low in range(0, top + 1, QUERY_WINDOW):
            high = low + QUERY_WINDOW
            have = self.present(low, high)
            window = {p for p in want if low <= p < high}
            missing += sorted(window - have)
            extra += sorted(have - window)
        extra += sorted(self.present(top + 1, 2**63 - 1))       # rows no pid of the store's ever named
        if extra:
            self.delete(extra)
        if missing:
            self.insert(missing, vectors_of(np.asarray(missing, dtype=np.int64)))
        return len(missing), len(extra)

    def wait_indexed(self, timeout_s: float) -> None:
        """Until every sealed row is indexed (a fresh upload is searched through the index, not brute force)."""
        from pymilvus import utility

        self.connection.call(f"waiting for {self.name}'s index", lambda: utility.wait_for_index_building_complete(
            self.name, timeout=timeout_s, using=self.connection.alias), timeout_s + 5)

    def reload(self) -> None:
        """Release and load again (the query node then loads the built index)."""
        collection = self.collection()
        timeout = self.connection.settings.timeout_s * 30
        self.connection.call(f"reloading {self.name}", lambda: (collection.release(timeout=timeout),
                                                               collection.load(timeout=timeout)), timeout * 2 + 1)

    def drop(self) -> None:
        from pymilvus import utility

        def run():
            if utility.has_collection(self.name, using=self.connection.alias):
                utility.drop_collection(self.name, timeout=self.connection.settings.timeout_s * 6,
                                        using=self.connection.alias)
        self.connection.call(f"dropping {self.name}", run, self.connection.settings.timeout_s * 6 + 1)
        self._collection = None
