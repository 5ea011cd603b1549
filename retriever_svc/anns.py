"""The ANNS retriever: DiskANN disk-index search with early results (update mode).

A query is embedded, then searched with a growing candidate list size L (the schedule, e.g.
16,32,64,128,256). Every stage's top-k is merged with what earlier stages found (distances
are exact, so an item of the true top-k, once found, never leaves the list: recall never
drops from one stage to the next), and an UPDATE chunk with the full current list goes out
whenever the list changes; the last stage, at the full L, always goes out and is final.
Each search runs in a worker thread, so a cancelled call stops between stages. With the
option measure_recall=true, each chunk's stage also carries recall@k against brute force.

`AnnsIndex.stages` is the synchronous core shared by the service and `bench retrieval`.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protos import common_pb2, retriever_pb2
from retriever_svc.corpus.index import INDEX_PREFIX, STORE, VECTORS, default_index_dir, quiet_diskann, read_manifest
from retriever_svc.corpus.store import PassageStore
from retriever_svc.service import InvalidQuery, RetrievalQuery
from retriever_svc.stability import stability_hints

DEFAULT_SCHEDULE = (16, 64, 256)      # measured: see `streamrag bench retrieval`
DEFAULT_BEAM_WIDTH = 8
MAX_L = 4096
MAX_STAGES = 16
MAX_BEAM_WIDTH = 64
NODES_TO_CACHE = 2000       # graph nodes around the medoid kept in memory
SEARCH_THREADS = 8          # DiskANN scratch spaces: concurrent searches per beam width
OPTIONS = frozenset({"l_schedule", "beam_width", "measure_recall"})


def parse_schedule(text: str) -> tuple[int, ...]:
    """ "16,32,64" -> (16, 32, 64); strictly increasing sizes in [1, MAX_L]."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"l_schedule must be comma-separated integers, got {text!r}") from None
    if not sizes or len(sizes) > MAX_STAGES:
        raise ValueError(f"l_schedule needs 1 to {MAX_STAGES} sizes, got {text!r}")
    if any(not 1 <= size <= MAX_L for size in sizes) or list(sizes) != sorted(set(sizes)):
        raise ValueError(f"l_schedule sizes must increase strictly within [1, {MAX_L}], got {text!r}")
    return sizes


def parse_beam_width(text: str | int) -> int:
    try:
        width = int(text)
    except ValueError:
        raise ValueError(f"beam_width must be an integer, got {text!r}") from None
    if not 1 <= width <= MAX_BEAM_WIDTH:
        raise ValueError(f"beam_width must be in [1, {MAX_BEAM_WIDTH}], got {width}")
    return width


def effective_schedule(schedule: Sequence[int], k: int) -> list[int]:
    """Each L raised to at least k; sizes that become equal are searched once."""
    sizes: list[int] = []
    for size in schedule:
        size = max(size, k)
        if not sizes or size > sizes[-1]:
            sizes.append(size)
    return sizes


@dataclass(frozen=True)
class Stage:
    index: int
    search_list_size: int
    rows: list[int]              # merged top-k, best first
    distances: list[float]       # squared L2 between unit vectors: 2 - 2 cos
    elapsed_s: float             # from the start of the staged search to this stage's list
    changed: bool                # the list differs from the previous stage's
    final: bool


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
                quiet_diskann()
                import diskannpy

                self._searchers[beam_width] = diskannpy.StaticDiskIndex(
                    str(self.directory), num_threads=SEARCH_THREADS, beam_width=beam_width,
                    num_nodes_to_cache=self._nodes_to_cache, index_prefix=INDEX_PREFIX)
            return self._searchers[beam_width]

    def search(self, vector: np.ndarray, k: int, search_list_size: int, beam_width: int):
        """One DiskANN search: (rows, squared distances), best first."""
        k = min(k, self.size)
        found = self.searcher(beam_width).search(vector, k_neighbors=k, complexity=max(search_list_size, k))
        return found.identifiers.tolist(), found.distances.tolist()

    def exact(self, vector: np.ndarray, k: int) -> list[int]:
        """Brute-force top-k rows (ground truth for recall)."""
        k = min(k, self.size)
        scores = np.asarray(self.vectors @ vector)
        top = np.argpartition(-scores, k - 1)[:k]
        return top[np.argsort(-scores[top], kind="stable")].tolist()

    def stages(self, vector: np.ndarray, k: int, schedule: Sequence[int], beam_width: int) -> Iterator[Stage]:
        """Search at each L of the schedule in turn (one search per `next`), merging as it goes."""
        k = min(k, self.size)
        sizes = effective_schedule(schedule, k)
        best: dict[int, float] = {}
        previous: list[int] = []
        started = time.perf_counter()
        for index, size in enumerate(sizes):
            rows, distances = self.search(vector, k, size, beam_width)
            best.update(zip(rows, distances, strict=True))
            top = sorted(best.items(), key=lambda item: (item[1], item[0]))[:k]
            best = dict(top)
            current = [row for row, _ in top]
            yield Stage(index, size, current, [d for _, d in top], time.perf_counter() - started,
                        current != previous, index == len(sizes) - 1)
            previous = current

    def close(self) -> None:
        self.store.close()


def recall(rows: Sequence[int], exact: Sequence[int]) -> float:
    return len(set(rows) & set(exact)) / len(exact) if exact else 1.0


class AnnsBackend:
    """`RetrieverBackend` over an `AnnsIndex`; options: l_schedule, beam_width, measure_recall."""

    kind = retriever_pb2.RETRIEVER_KIND_ANNS
    options = OPTIONS

    def __init__(self, index: AnnsIndex, schedule: Sequence[int] = DEFAULT_SCHEDULE,
                 beam_width: int = DEFAULT_BEAM_WIDTH, embed_query: Callable[[str], np.ndarray] | None = None) -> None:
        self.index = index
        self.schedule = tuple(schedule)
        self.beam_width = beam_width
        self._embed_query = embed_query or _embed_one
        self._embed_lock = threading.Lock()      # a fast tokenizer must not be used by two threads at once

    def embed(self, text: str) -> np.ndarray:
        with self._embed_lock:
            return self._embed_query(text)

    def settings(self, options: Mapping[str, str]) -> tuple[tuple[int, ...], int, bool]:
        """(schedule, beam width, measure recall) for one query; InvalidQuery on bad values."""
        try:
            schedule = parse_schedule(options["l_schedule"]) if "l_schedule" in options else self.schedule
            width = parse_beam_width(options["beam_width"]) if "beam_width" in options else self.beam_width
        except ValueError as exc:
            raise InvalidQuery(str(exc)) from None
        measure = options.get("measure_recall", "false").strip().lower()
        if measure not in ("true", "false", "1", "0"):
            raise InvalidQuery(f"measure_recall must be true or false, got {options['measure_recall']!r}")
        return schedule, width, measure in ("true", "1")

    async def retrieve(self, query: RetrievalQuery) -> AsyncIterator[retriever_pb2.ContextChunk]:
        schedule, width, measure = self.settings(query.options)
        vector = await asyncio.to_thread(self.embed, query.query)
        exact = await asyncio.to_thread(self.index.exact, vector, query.top_k) if measure else None
        stages = self.index.stages(vector, query.top_k, schedule, width)
        previous: list[str] | None = None          # the ids of the last chunk sent
        while True:
            stage, chunk = await asyncio.to_thread(self._advance, stages, exact, previous)
            if stage is None:
                return
            if chunk is not None:
                previous = [d.id for d in chunk.documents]
                yield chunk

    def _advance(self, stages: Iterator[Stage], exact: list[int] | None, previous: list[str] | None):
        """Run the next stage (in a worker thread); its chunk when the list changed or it is the last."""
        stage = next(stages, None)
        if stage is None or not (stage.changed or stage.final):
            return stage, None
        return stage, self._chunk(stage, exact, previous)

    def _chunk(self, stage: Stage, exact: list[int] | None, previous: list[str] | None) -> retriever_pb2.ContextChunk:
        passages = self.index.store.get(stage.rows)
        hints = stability_hints(previous, [p.id for p in passages], stage.final)
        documents = [common_pb2.Document(id=p.id, title=p.title, url=p.url, text=p.text, score=1.0 - d / 2,
                                         source="anns", stability=hint)
                     for p, d, hint in zip(passages, stage.distances, hints, strict=True)]
        info = retriever_pb2.StageInfo(index=stage.index, search_list_size=stage.search_list_size)
        if exact is not None:
            info.recall_at_k = recall(stage.rows, exact)
        return retriever_pb2.ContextChunk(mode=retriever_pb2.CHUNK_MODE_UPDATE, documents=documents,
                                          final=stage.final, stage=info)

    def describe(self) -> retriever_pb2.RetrieverInfo:
        manifest = self.index.manifest
        params = manifest.get("params", {})
        facts = {"embedding_model": manifest.get("embedding_model", ""), "dim": str(manifest.get("dim", "")),
                 "metric": manifest.get("metric", ""), "graph_degree": str(params.get("graph_degree", "")),
                 "build_complexity": str(params.get("build_complexity", "")),
                 "pq_chunks": str(params.get("pq_chunks", "")), "max_passage_tokens": str(params.get("max_tokens", "")),
                 "search_list_sizes": ",".join(map(str, self.schedule)), "beam_width": str(self.beam_width),
                 "pages": str(manifest.get("pages", "")), "index_dir": str(self.index.directory)}
        return retriever_pb2.RetrieverInfo(kind=self.kind, corpus=manifest.get("corpus", ""),
                                           num_documents=self.index.size, facts=facts)

    def warm_up(self) -> None:
        """Load the embedder and page the index in, so the first query is not the slow one."""
        vector = self.embed("warm up")
        for _ in self.index.stages(vector, 1, self.schedule[:1], self.beam_width):
            pass


def _embed_one(text: str) -> np.ndarray:
    from retriever_svc.embedding import embed

    return embed([text])[0]


def build_backend(args: argparse.Namespace) -> AnnsBackend:
    """The backend `streamrag serve retriever --kind anns` runs (flags from retriever_svc.server_args)."""
    directory = args.index or default_index_dir()
    try:
        schedule, width = parse_schedule(str(args.l_schedule)), parse_beam_width(args.beam_width)
        index = AnnsIndex(directory)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"error: {exc}") from None
    backend = AnnsBackend(index, schedule, width)
    backend.warm_up()
    return backend
