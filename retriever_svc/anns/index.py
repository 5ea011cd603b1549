"""The bundled index (`streamrag index build`'s directory) opened for search: DiskANN disk
index, passages in SQLite, vectors for exact search.

`AnnsIndex.stages` is the synchronous core shared by the service (`anns.backend`) and
`streamrag bench retrieval`; `recall` is the one recall@k rule of both.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from retriever_svc.corpus.index import STORE, VECTORS, open_disk_searcher, read_manifest
from retriever_svc.corpus.passages import Passage
from retriever_svc.corpus.store import PassageStore
from retriever_svc.stages import Stage, exact_top, staged

NODES_TO_CACHE = 2000       # graph nodes around the medoid kept in memory


class AnnsIndex:
    """An index directory from `streamrag index build`, opened for search."""

    def __init__(self, directory: Path, nodes_to_cache: int = NODES_TO_CACHE) -> None:
        self.directory = Path(directory)
        manifest = read_manifest(self.directory)
        if manifest is None:
            raise FileNotFoundError(f"no complete index in {self.directory}: run `streamrag index build`")
        self.manifest = manifest
        self.store = PassageStore(self.directory / STORE)
        self.vectors = np.load(self.directory / VECTORS, mmap_mode="r")
        self.size = int(self.vectors.shape[0])
        self._nodes_to_cache = min(nodes_to_cache, self.size)
        self._searchers: dict[int, object] = {}
        self._lock = threading.Lock()

    def searcher(self, beam_width: int):
        """One DiskANN `StaticDiskIndex` per beam width (opened on first use)."""
        with self._lock:
            if beam_width not in self._searchers:
                self._searchers[beam_width] = open_disk_searcher(self.directory, beam_width, self.size,
                                                                 self._nodes_to_cache)
            return self._searchers[beam_width]

    def search(self, vector: np.ndarray, k: int, search_list_size: int, beam_width: int):
        """One DiskANN search: (rows, squared distances), best first."""
        k = min(k, self.size)
        found = self.searcher(beam_width).search(vector, k_neighbors=k, complexity=max(search_list_size, k))
        return found.identifiers.tolist(), found.distances.tolist()

    def exact(self, vector: np.ndarray, k: int) -> list[int]:
        """Brute-force top-k rows (ground truth for recall)."""
        return exact_top(self.vectors, vector, k)

    def stages(self, vector: np.ndarray, k: int, schedule: Sequence[int], beam_width: int) -> Iterator[Stage]:
        """Search at each L of the schedule in turn (one search per `next`), merging as it goes."""
        return staged(lambda v, kk, size: self.search(v, kk, size, beam_width), vector, min(k, self.size), schedule)

    def passages(self, rows: Sequence[int]) -> dict[int, Passage]:
        return dict(zip(rows, self.store.get(rows), strict=True))

    def close(self) -> None:
        self.store.close()


def recall(rows: Sequence[int], exact: Sequence[int]) -> float:
    return len(set(rows) & set(exact)) / len(exact) if exact else 1.0
