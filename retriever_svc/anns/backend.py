"""The ANNS retriever: DiskANN disk-index search with early results (update mode).

A query is embedded, then searched with a growing candidate list size L (the schedule, e.g.
16,32,64,128,256). Every stage's top-k is merged with what earlier stages found (distances
are exact, so an item of the true top-k, once found, never leaves the list: recall never
drops from one stage to the next), and an UPDATE chunk with the full current list goes out
whenever the list changes; the last stage, at the full L, always goes out and is final.
Each search runs in a worker thread, so a cancelled call stops between stages. With the
option measure_recall=true, each chunk's stage also carries recall@k against brute force.

The retriever serves several collections (`retriever_svc.collections`): the bundled index
(`anns.index.AnnsIndex`) as the default, and the user's live ones, searched the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from protos import common_pb2, retriever_pb2
from retriever_svc.anns.index import AnnsIndex, recall
from retriever_svc.collections.registry import BUILD_STOP_TIMEOUT_S, CollectionRegistry, DefaultCollection
from retriever_svc.corpus.embedding import EMBEDDING_DIM
from retriever_svc.corpus.index import default_index_dir, read_manifest
from retriever_svc.corpus.passages import Passage
from retriever_svc.service import InvalidQuery, RetrievalQuery
from retriever_svc.stability import stability_hints
from retriever_svc.stages import Stage

DEFAULT_SCHEDULE = (16, 64, 256)      # measured: see `streamrag bench retrieval`
DEFAULT_BEAM_WIDTH = 8
MAX_L = 4096
MAX_STAGES = 16
MAX_BEAM_WIDTH = 64
INGEST_BATCH = 8            # passages embedded per turn of the embedding lock while adding files
QUERY_PRIORITY_MAX_WAIT_S = 1.0   # ingestion waits for queries to be embedded, but not forever
OPTIONS = frozenset({"l_schedule", "beam_width", "measure_recall"})
log = logging.getLogger(__name__)


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


class AnnsBackend:
    """`RetrieverBackend` over collections (or one `AnnsIndex`); options: l_schedule, beam_width, measure_recall."""

    kind = retriever_pb2.RETRIEVER_KIND_ANNS
    options = OPTIONS
    has_collections = True

    def __init__(self, index: AnnsIndex | CollectionRegistry, schedule: Sequence[int] = DEFAULT_SCHEDULE,
                 beam_width: int = DEFAULT_BEAM_WIDTH, embed_query: Callable[[str], np.ndarray] | None = None) -> None:
        if isinstance(index, CollectionRegistry):
            self.collections = index
        else:
            self.collections = CollectionRegistry(None, DefaultCollection(index))
        self.schedule = tuple(schedule)
        self.beam_width = beam_width
        self._embed_query = embed_query or _embed_one
        self.embed_lock = threading.Lock()      # a fast tokenizer must not be used by two threads at once
        self._queries = threading.Condition()   # queries waiting to embed go before the next ingestion batch
        self._queries_waiting = 0

    @property
    def index(self) -> AnnsIndex | None:
        """The default collection's index (None while it builds)."""
        return self.collections.default.index

    def close(self) -> None:
        """At shutdown: a background build of the default index stops at its next commit."""
        if not self.collections.default.stop_building():
            log.warning("the default index build did not stop within %.0f s", BUILD_STOP_TIMEOUT_S)

    def embed(self, text: str) -> np.ndarray:
        with self._queries:
            self._queries_waiting += 1
        try:
            with self.embed_lock:
                return self._embed_query(text)
        finally:
            with self._queries:
                self._queries_waiting -= 1
                self._queries.notify_all()

    def embed_passages(self, passages: list[Passage]) -> np.ndarray:
        """Passage vectors, a few at a time; a query waiting to be embedded goes before the next few."""
        from retriever_svc.corpus.index import embed_passages

        parts = []
        for start in range(0, len(passages), INGEST_BATCH):
            with self._queries:
                self._queries.wait_for(lambda: self._queries_waiting == 0, timeout=QUERY_PRIORITY_MAX_WAIT_S)
            with self.embed_lock:
                parts.append(embed_passages(passages[start:start + INGEST_BATCH], "auto", progress=False))
        return np.concatenate(parts) if parts else np.zeros((0, EMBEDDING_DIM), dtype=np.float32)

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
        searchable = self.collections.searchable(query.collection)
        vector = await asyncio.to_thread(self.embed, query.query)
        exact = await asyncio.to_thread(searchable.exact, vector, query.top_k) if measure else None
        stages = searchable.stages(vector, query.top_k, schedule, width)
        previous: list[str] | None = None          # the ids of the last chunk sent
        while True:
            stage, chunk = await asyncio.to_thread(self._advance, searchable, stages, exact, previous)
            if stage is None:
                return
            if chunk is not None:
                previous = [d.id for d in chunk.documents]
                yield chunk

    def _advance(self, searchable, stages: Iterator[Stage], exact: list[int] | None, previous: list[str] | None):
        """Run the next stage (in a worker thread); its chunk when the list changed or it is the last."""
        stage = next(stages, None)
        if stage is None or not (stage.changed or stage.final):
            return stage, None
        return stage, self._chunk(searchable, stage, exact, previous)

    def _chunk(self, searchable, stage: Stage, exact: list[int] | None,
               previous: list[str] | None) -> retriever_pb2.ContextChunk:
        found = searchable.passages(stage.rows)       # a passage removed since the search is left out
        kept = [(found[row], d) for row, d in zip(stage.rows, stage.distances, strict=True) if row in found]
        hints = stability_hints(previous, [p.id for p, _ in kept], stage.final)
        documents = [common_pb2.Document(id=p.id, title=p.title, url=p.url, text=p.text, score=1.0 - d / 2,
                                         source="anns", stability=hint)
                     for (p, d), hint in zip(kept, hints, strict=True)]
        info = retriever_pb2.StageInfo(index=stage.index, search_list_size=stage.search_list_size)
        if exact is not None:
            info.recall_at_k = recall(stage.rows, exact)
        return retriever_pb2.ContextChunk(mode=retriever_pb2.CHUNK_MODE_UPDATE, documents=documents,
                                          final=stage.final, stage=info)

    def describe(self) -> retriever_pb2.RetrieverInfo:
        facts = {"search_list_sizes": ",".join(map(str, self.schedule)), "beam_width": str(self.beam_width),
                 "collections": ",".join(info["name"] for info in self.collections.infos())}
        if self.index is None:
            default = self.collections.default.info()
            facts |= {"default_state": default["state"], "default_progress": default["progress"]}
            return retriever_pb2.RetrieverInfo(kind=self.kind, facts=facts)
        manifest = self.index.manifest
        params = manifest.get("params", {})
        facts |= {"embedding_model": manifest.get("embedding_model", ""), "dim": str(manifest.get("dim", "")),
                  "metric": manifest.get("metric", ""), "graph_degree": str(params.get("graph_degree", "")),
                  "build_complexity": str(params.get("build_complexity", "")),
                  "pq_chunks": str(params.get("pq_chunks", "")),
                  "max_passage_tokens": str(params.get("max_tokens", "")),
                  "pages": str(manifest.get("pages", "")), "index_dir": str(self.index.directory)}
        return retriever_pb2.RetrieverInfo(kind=self.kind, corpus=manifest.get("corpus", ""),
                                           num_documents=self.index.size, facts=facts)

    def warm_up(self) -> None:
        """Load the embedder and page the index in, so the first query is not the slow one."""
        vector = self.embed("warm up")
        if self.index is not None:
            for _ in self.index.stages(vector, 1, self.schedule[:1], self.beam_width):
                pass


def _embed_one(text: str) -> np.ndarray:
    from retriever_svc.corpus.embedding import embed

    return embed([text])[0]


def build_backend(args: argparse.Namespace) -> AnnsBackend:
    """The backend `streamrag serve retriever --kind anns` runs (flags from retriever_svc.server_args).

    With --build-from, a missing default index is built from that HTML tree in the background
    while the live collections serve; without it, a missing index is an error at start.
    """
    from retriever_svc.collections.registry import default_collections_root

    directory = args.index or default_index_dir()
    try:
        schedule, width = parse_schedule(str(args.l_schedule)), parse_beam_width(args.beam_width)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    default = DefaultCollection()
    if str(directory) == "none":
        default.error = "this retriever was started without one (--index none)"
    elif read_manifest(directory) is not None:
        default.index = AnnsIndex(directory)
    elif args.build_from is None:
        raise SystemExit(f"error: no complete index in {directory}: run `streamrag index build` "
                         "(or start with --build-from SOURCE to build it in the background)")
    backend = AnnsBackend(CollectionRegistry(args.collections or default_collections_root(), default), schedule, width)
    backend.warm_up()
    if default.index is None and not default.error:
        default.build_in_background(lambda report: _build_default(args.build_from, directory, report,
                                                                  args.build_commit_every))
    return backend


def _build_default(source: Path, directory: Path, report: Callable[[str], None],
                   commit_every: int | None) -> AnnsIndex:
    from retriever_svc.corpus.index import build_index

    build_index(source, directory, progress=False, say=report, on_progress=report, commit_every=commit_every)
    return AnnsIndex(directory)
