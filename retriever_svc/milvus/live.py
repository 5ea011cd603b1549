"""A live collection whose searchable side is a Milvus collection; its SQLite store stays the truth.

Adding a file commits it to the store, then writes it to Milvus (delete the file's old pids,
insert its new ones), and only then is it answered: an acknowledged file is in the store and
in Milvus's write-ahead log, and survives a restart of either. If the Milvus write fails
(Milvus down or slow) the call ends UNAVAILABLE, the file stays committed, and the index is
marked out of step: the background merger (`needs_merge`/`merge`) reconciles Milvus with the
store as soon as Milvus answers again, as it does once at open. Milvus searches its growing
segments by brute force and its sealed ones through the index, so there is no memory part
of ours; a merge here is a reconcile plus a flush that seals what was inserted (Milvus then
builds the index over it).

The Milvus collection's name carries a token kept in the store (`milvus_collection`), so a
collection created again under an old name never meets the old one's vectors.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from retriever_svc.collections.live import MERGE_MEMORY_PASSAGES
from retriever_svc.collections.search_index import SearchIndex
from retriever_svc.corpus.collection_store import CollectionStore, FileChange
from retriever_svc.milvus.connection import MilvusConnection
from retriever_svc.milvus.index import MilvusIndex
from retriever_svc.service import RetrieverUnavailable
from retriever_svc.stages import Stage

NAME_KEY = "milvus_collection"


def milvus_name(collection: str) -> str:
    """A Milvus collection name (letters, digits, _) for one of ours (which may hold '-'), unique per creation."""
    return "sr_" + re.sub(r"[^A-Za-z0-9]", "_", collection) + "_" + uuid.uuid4().hex[:12]


class MilvusLiveIndex(SearchIndex):
    """The `search_index.SearchIndex` of one collection folder, on Milvus."""

    def __init__(self, directory: Path, store: CollectionStore, connection: MilvusConnection) -> None:
        super().__init__(directory, store)
        name = store.meta(NAME_KEY)
        if not name:
            name = milvus_name(self.directory.name)
            store.set_meta({NAME_KEY: name})
        self.milvus = MilvusIndex(connection, name)
        self._size = store.counts()[1]
        self._unsealed: set[int] = set()   # pids inserted since the last flush and not removed since
        self.out_of_step = True            # reconciled at the first merge (and after any failed write)
        with contextlib.suppress(RetrieverUnavailable):   # Milvus down: the background merger retries
            self.merge()

    @property
    def size(self) -> int:
        return self._size

    def counts(self) -> dict[str, int]:
        return {"disk_passages": self._size - len(self._unsealed), "memory_passages": len(self._unsealed),
                "deleted_passages": 0}

    # ---- searching ----
    def stages(self, vector: np.ndarray, k: int, schedule: Sequence[int], beam_width: int) -> Iterator[Stage]:
        """`beam_width` is DiskANN's I/O width inside Milvus (its `BeamWidthRatio`), not a per-search option."""
        return self.milvus.stages(vector, max(1, min(k, max(self._size, 1))), schedule)

    # ---- writing ----
    def apply(self, change: FileChange, vectors: np.ndarray) -> None:
        self._size = self.store.counts()[1]
        self._write(change.removed_pids, change.added_pids, vectors)

    def remove(self, pids: Sequence[int]) -> None:
        self._size = self.store.counts()[1]
        self._write(pids, [], self.no_vectors())

    def _write(self, removed: Sequence[int], added: Sequence[int], vectors: np.ndarray) -> None:
        try:
            if removed:
                self.milvus.delete(removed)
            if added:
                self.milvus.insert(added, vectors)
        except RetrieverUnavailable as exc:
            self.out_of_step = True
            raise RetrieverUnavailable(f"{exc}; the change is committed to the collection and reaches Milvus "
                                       "when it answers again") from exc
        self._unsealed.difference_update(int(p) for p in removed)
        self._unsealed.update(int(p) for p in added)

    # ---- reconciling ----
    def needs_merge(self) -> bool:
        return self.out_of_step or len(self._unsealed) >= MERGE_MEMORY_PASSAGES

    def _merge(self, threads: int) -> None:
        """Reconcile Milvus with the store (when out of step) and flush what was inserted since the last one."""
        with self._write_lock:
            if self.out_of_step:
                pids, _ = self.store.vectors()
                self.milvus.reconcile(pids, self._vectors_of, self.store.max_pid())
                self.out_of_step = False
            unsealed, self._unsealed = self._unsealed, set()
        if unsealed:
            try:
                self.milvus.flush()
            except RetrieverUnavailable:
                with self._write_lock:            # still unsealed, less what was removed meanwhile
                    kept = self.store.live_pids(np.fromiter(unsealed, dtype=np.int64))
                    self._unsealed.update(kept.tolist())
                raise

    def _vectors_of(self, pids: np.ndarray) -> np.ndarray:
        all_pids, vectors = self.store.vectors()
        return vectors[np.searchsorted(all_pids, pids)]

    def drop(self) -> None:
        self.milvus.drop()
