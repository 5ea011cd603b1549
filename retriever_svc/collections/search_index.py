"""The live-index base: what every collection's searchable side shares, whichever engine searches it.

A collection's SQLite store (`store.CollectionStore`) is the truth; its index is what searches
it. Two engines implement one: `live.LiveIndex` (diskannpy, the default: a disk generation plus
an exact in-memory part) and `retriever_svc.milvus.live.MilvusLiveIndex`. This base owns what
they share:

- the store and the folder;
- the write lock (`writing`), held around a store commit and its `apply`/`remove`, so that a
  merge never sees one without the other;
- one merge at a time (`merge`, with the `merging` flag); each engine writes only `_merge`;
- exact search over the stored vectors (`exact`, the ground truth for recall);
- the embedding dimension (`DIM`, the model's: `corpus.embedding.EMBEDDING_DIM`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from retriever_svc.corpus.collection_store import CollectionStore, FileChange
from retriever_svc.corpus.embedding import EMBEDDING_DIM
from retriever_svc.stages import Stage, exact_top


class SearchIndex:
    """What a collection searches and writes through; the store stays the truth either way."""

    DIM = EMBEDDING_DIM

    def __init__(self, directory: Path, store: CollectionStore) -> None:
        self.directory = Path(directory)
        self.store = store
        self._write_lock = threading.Lock()       # one writer (add, remove, merge swap) at a time
        self._merge_lock = threading.Lock()       # one merge at a time
        self.merging = False

    # ---- what each engine writes ----
    @property
    def size(self) -> int:
        raise NotImplementedError

    def counts(self) -> dict[str, int]:
        """disk_passages, memory_passages, deleted_passages."""
        raise NotImplementedError

    def stages(self, vector: np.ndarray, k: int, schedule: Sequence[int], beam_width: int) -> Iterator[Stage]:
        raise NotImplementedError

    def apply(self, change: FileChange, vectors: np.ndarray) -> None:
        """Publish a committed file change (under `writing()`): its old passages leave, its new ones join."""
        raise NotImplementedError

    def remove(self, pids: Sequence[int]) -> None:
        """Publish committed removals (under `writing()`)."""
        raise NotImplementedError

    def needs_merge(self) -> bool:
        raise NotImplementedError

    def _merge(self, threads: int) -> None:
        """The engine's merge, with the merge lock held."""
        raise NotImplementedError

    def drop(self) -> None:
        """The collection is being dropped: release what lives outside its folder."""

    # ---- shared ----
    def exact(self, vector: np.ndarray, k: int) -> list[int]:
        """Brute-force top-k live pids (ground truth for recall)."""
        pids, vectors = self.store.vectors()
        return pids[exact_top(vectors, vector, k)].tolist()

    def writing(self) -> threading.Lock:
        """Held around a store commit and its `apply`/`remove`, so that a merge never sees one without the other."""
        return self._write_lock

    def merge(self, threads: int = 1, wait: bool = True) -> bool:
        """Merge (what that means is the engine's `_merge`). With `wait`, a merge already running is waited for
        first (then this one merges what came after it); without, this returns False at once."""
        if not self._merge_lock.acquire(blocking=wait):
            return False
        try:
            self.merging = True
            self._merge(threads)
            return True
        finally:
            self.merging = False
            self._merge_lock.release()

    @classmethod
    def no_vectors(cls) -> np.ndarray:
        """An empty (0, DIM) float32 array: the vectors of a change that adds nothing."""
        return np.zeros((0, cls.DIM), dtype=np.float32)
