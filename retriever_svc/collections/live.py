"""A live collection's search index, after FreshDiskANN: a disk index plus an in-memory part.

- The **disk part** is a DiskANN disk index built from a snapshot of the store (a
  generation, `gen-N/`, with `pids.npy` naming each of its rows by passage id).
- The **memory part** holds the passages added since that snapshot. It is searched exactly
  (brute force), as Milvus searches its growing segments: diskannpy-rust 0.49's mutable
  indexes (`AsyncDiskIndex`, `BfTreeIndex`) did not find inserted points here (recall@10
  0.01 on an index filled by inserts), and a matrix product over a few thousand vectors
  takes milliseconds.
- **Delete marks**: disk-part passages removed since the snapshot are skipped in results.
- A **merge** builds the next generation from the store in the background while searches
  and writes go on, then swaps it in: the store's `generation` key is the one switch, so a
  crash leaves either the old generation or the new one, never a mix.

Searches read one immutable `View`; writers publish a new one. Results from both parts
are merged by distance, stage by stage, so the early results keep working.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from retriever_svc.collections.search_index import SearchIndex
from retriever_svc.corpus.collection_store import CollectionStore, FileChange
from retriever_svc.corpus.index import BuildParams, build_disk_index, open_disk_searcher
from retriever_svc.stages import Stage, exact_top, staged

GENERATION_KEY = "generation"
WATERMARK_KEY = "watermark"        # the largest pid the current generation's snapshot held
PIDS = "pids.npy"
MERGE_MEMORY_PASSAGES = 5_000      # a background merge starts past this many passages in memory...
MERGE_DELETED_FRACTION = 0.25      # ...or this fraction of the disk part deleted
MERGE_PARAMS = BuildParams()


@dataclass
class DiskPart:
    """One generation's DiskANN disk index; searchers are opened per beam width on first use."""

    directory: Path
    pids: np.ndarray                           # row -> pid
    _searchers: dict[int, object] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def search(self, vector: np.ndarray, k: int, search_list_size: int, beam_width: int):
        with self._lock:
            if beam_width not in self._searchers:
                self._searchers[beam_width] = open_disk_searcher(self.directory, beam_width, len(self.pids))
            searcher = self._searchers[beam_width]
        k = min(k, len(self.pids))
        found = searcher.search(vector, k_neighbors=k, complexity=max(search_list_size, k))
        return self.pids[found.identifiers].tolist(), found.distances.tolist()


@dataclass(frozen=True)
class View:
    generation: int
    disk: DiskPart | None
    memory_pids: np.ndarray                    # sorted
    memory_vectors: np.ndarray
    deleted: frozenset[int]                    # disk-part pids removed since the snapshot

    @property
    def disk_size(self) -> int:
        return 0 if self.disk is None else len(self.disk.pids)

    @property
    def size(self) -> int:
        return self.disk_size - len(self.deleted) + len(self.memory_pids)


class LiveIndex(SearchIndex):
    """The searchable side of one collection directory (`collection.sqlite`, `gen-N/`)."""

    def __init__(self, directory: Path, store: CollectionStore) -> None:
        super().__init__(directory, store)
        self.view = self._load()

    # ---- opening ----
    def _load(self) -> View:
        """The view the store describes; generations it does not name are leftovers of a crash."""
        generation = int(self.store.meta(GENERATION_KEY, "0"))
        for path in [*self.directory.glob("gen-*"), *self.directory.glob(".gen-*")]:
            if path.name != f"gen-{generation}":
                shutil.rmtree(path, ignore_errors=True)
        disk, deleted = None, frozenset()
        if generation:
            disk_dir = self.directory / f"gen-{generation}"
            pids = np.load(disk_dir / PIDS)
            disk = DiskPart(disk_dir, pids)
            deleted = frozenset(set(pids.tolist()) - set(self.store.live_pids(pids).tolist()))
        memory_pids, memory_vectors = self.store.vectors(after_pid=int(self.store.meta(WATERMARK_KEY, "0")))
        return View(generation, disk, memory_pids, memory_vectors, deleted)

    @property
    def size(self) -> int:
        return self.view.size

    def counts(self) -> dict[str, int]:
        view = self.view
        return {"disk_passages": view.disk_size, "memory_passages": len(view.memory_pids),
                "deleted_passages": len(view.deleted)}

    # ---- searching ----
    def search(self, vector: np.ndarray, k: int, search_list_size: int, beam_width: int,
               view: View | None = None) -> tuple[list[int], list[float]]:
        """Top-k live pids and squared distances from both parts."""
        view = view or self.view
        found: list[tuple[float, int]] = []
        if view.disk is not None and view.disk_size > len(view.deleted):
            found += self._search_disk(view, vector, k, search_list_size, beam_width)
        if len(view.memory_pids):
            top = exact_top(view.memory_vectors, vector, k)
            distances = 2.0 - 2.0 * (view.memory_vectors[top] @ vector)
            found += list(zip(distances.tolist(), view.memory_pids[top].tolist(), strict=True))
        found.sort()
        return [p for _, p in found[:k]], [max(0.0, d) for d, _ in found[:k]]

    @staticmethod
    def _search_disk(view: View, vector: np.ndarray, k: int, search_list_size: int,
                     beam_width: int) -> list[tuple[float, int]]:
        """The disk part's k nearest live passages: deleted ones are skipped, and the search widened (doubling
        the candidates asked for) until k live ones are found or the whole part has been asked for."""
        live = view.disk_size - len(view.deleted)
        want = min(view.disk_size, int(np.ceil(k * view.disk_size / live)))
        while True:
            pids, distances = view.disk.search(vector, want, max(search_list_size, want), beam_width)
            found = [(d, p) for p, d in zip(pids, distances, strict=True) if p not in view.deleted]
            if len(found) >= min(k, live) or want >= view.disk_size:
                return found
            want = min(view.disk_size, want * 2)

    def stages(self, vector: np.ndarray, k: int, schedule: Sequence[int], beam_width: int) -> Iterator[Stage]:
        view = self.view
        k = max(1, min(k, view.size))
        return staged(lambda v, kk, size: self.search(v, kk, size, beam_width, view), vector, k, schedule)

    # ---- writing ----
    def apply(self, change: FileChange, vectors: np.ndarray) -> None:
        self._publish(change.removed_pids, np.asarray(change.added_pids, dtype=np.int64), vectors)

    def remove(self, pids: Sequence[int]) -> None:
        self._publish(pids, np.zeros(0, dtype=np.int64), self.no_vectors())

    def _publish(self, removed: Sequence[int], added: np.ndarray, vectors: np.ndarray) -> None:
        view = self.view
        gone = set(removed)
        keep = np.array([p not in gone for p in view.memory_pids.tolist()], dtype=bool)
        disk_pids = set() if view.disk is None else set(view.disk.pids.tolist())
        self.view = replace(
            view, memory_pids=np.concatenate([view.memory_pids[keep], added]),
            memory_vectors=np.concatenate([view.memory_vectors.reshape(-1, self.DIM)[keep],
                                           np.asarray(vectors, dtype=np.float32).reshape(-1, self.DIM)]),
            deleted=view.deleted | (gone & disk_pids))

    # ---- merging ----
    def needs_merge(self) -> bool:
        view = self.view
        return (len(view.memory_pids) >= MERGE_MEMORY_PASSAGES
                or (view.disk_size > 0 and len(view.deleted) >= MERGE_DELETED_FRACTION * view.disk_size))

    def _merge(self, threads: int) -> None:
        """Build the next generation from the store and swap it in."""
        with self._write_lock:                 # a consistent snapshot: no file half-applied
            pids, vectors = self.store.vectors()
            watermark = self.store.max_pid()
        generation = self.view.generation + 1
        target = self.directory / f"gen-{generation}"
        partial = self.directory / f".gen-{generation}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        if len(pids):
            build_disk_index(vectors, partial, MERGE_PARAMS, threads)
        np.save(partial / PIDS, pids)
        _fsync_tree(partial)
        os.replace(partial, target)
        with self._write_lock:
            if len(pids):
                disk = DiskPart(target, pids)
                # What changed while the snapshot was being indexed stays in the memory part.
                deleted = frozenset(set(pids.tolist()) - set(self.store.live_pids(pids).tolist()))
            else:
                disk, deleted = None, frozenset()
            after_pids, after_vectors = self.store.vectors(after_pid=watermark)
            self.store.set_meta({GENERATION_KEY: str(generation if len(pids) else 0),
                                 WATERMARK_KEY: str(watermark)})
            old = self.view
            self.view = View(generation if len(pids) else 0, disk, after_pids, after_vectors, deleted)
        if old.disk is not None:
            shutil.rmtree(old.disk.directory, ignore_errors=True)   # open searchers keep their files
        if not len(pids):
            shutil.rmtree(target, ignore_errors=True)


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
