"""One merged document list from one or two retrievers, and how to tell the engine about it.

The ANNS retriever sends UPDATE chunks (its complete current top-k); the crawler sends
APPEND chunks (new pages). The merged list is the ANNS part followed by the crawler part,
so a crawler page is always an `append` at the end, and an ANNS refinement is an `update`
of the whole list (the engine keeps KV up to the token LCP, so an unchanged head is free).

An update keeps the documents that survive a refinement where they were and puts the new
ones after them (`stable_order`), so a refinement invalidates only from the first document
it drops, not from the first rank that moved. Both the streamed and the non-streamed path
fold every chunk through the same `MergedDocuments`, so both build the identical prompt.

With both retrievers (`by_relevance=True`) the two lists are merged by relevance, not by
arrival alone:
- a crawler page whose page an ANNS passage already brought is left out (the same source
  twice only dilutes the context and costs prefill);
- the other crawler pages are ordered by their relevance score among themselves: a page
  more relevant than earlier ones by more than `RELEVANCE_MARGIN` goes before them, an
  `update` that keeps the KV of everything in front of it; otherwise it is an `append`.
  The margin keeps near-ties in arrival order, which is already the crawl's best-first
  order: without it 29% of the pages the crawler sends would move, with it 4%, most of them
  answering pages (`streamrag bench relevance`, docs/results.md "Retrieval quality"),
  each move invalidating the pages behind it.
The ANNS passages stay in front: they arrive first (milliseconds against seconds) and hit
the answering page more often, and moving them behind later pages would invalidate the
whole context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit

from protos import common_pb2, retriever_pb2

Doc = TypeVar("Doc")
RELEVANCE_MARGIN = 0.2       # crawler relevance (0..1) a page must gain to move before earlier pages


def page_of(url: str) -> str:
    """The page a document comes from: `http://h:8765/library/io.html#x` and `library/io.html#y`
    are both `library/io.html`."""
    parts = urlsplit(url)
    return (parts.path if parts.scheme else url.split("#", 1)[0].split("?", 1)[0]).strip("/")


def stable_order(previous_ids: Sequence[str], current: Sequence[Doc]) -> list[Doc]:
    """`current` reordered for the least invalidation: the documents also in `previous_ids`
    keep their previous relative order, the new ones follow in `current`'s (rank) order."""
    position = {doc_id: i for i, doc_id in enumerate(previous_ids)}
    kept = sorted((d for d in current if d.id in position), key=lambda d: position[d.id])
    return kept + [d for d in current if d.id not in position]


@dataclass
class MergedDocuments:
    ranked: list[common_pb2.Document] = field(default_factory=list)     # from UPDATE chunks
    appended: list[common_pb2.Document] = field(default_factory=list)   # from APPEND chunks
    by_relevance: bool = False          # APPEND documents ordered by score among themselves

    @property
    def all(self) -> list[common_pb2.Document]:
        return self.ranked + self.appended

    def _pages(self, docs: Sequence[common_pb2.Document]) -> set[str]:
        """The pages `docs` cover, which crawler pages must not repeat (only with both retrievers)."""
        return {page_of(d.url) for d in docs if d.url} if self.by_relevance else set()

    def apply(self, chunk: retriever_pb2.ContextChunk) -> tuple[str, list[common_pb2.Document]]:
        """Fold a chunk in. Returns ("append", new docs) / ("update", the whole list) / ("none", [])."""
        seen = {doc.id for doc in self.all}
        if chunk.mode == retriever_pb2.CHUNK_MODE_UPDATE:
            new_ranked = stable_order([d.id for d in self.ranked], chunk.documents)
            if [d.id for d in new_ranked] == [d.id for d in self.ranked]:
                return "none", []
            ranked_ids = {d.id for d in new_ranked}
            covered = self._pages(new_ranked)       # a refinement may bring a page a crawl already did
            self.appended = [d for d in self.appended
                             if d.id not in ranked_ids and not (d.url and page_of(d.url) in covered)]
            self.ranked = new_ranked
            return "update", self.all
        covered = self._pages(self.ranked)
        fresh = []
        for doc in chunk.documents:
            if doc.id not in seen and not (doc.url and page_of(doc.url) in covered):
                seen.add(doc.id)
                fresh.append(doc)
        if not fresh:
            return "none", []
        before = len(self.appended)
        first_placed = before
        for doc in fresh:
            at = len(self.appended)
            if self.by_relevance:      # before the first page it beats by more than the margin
                at = next((i for i, d in enumerate(self.appended) if d.score < doc.score - RELEVANCE_MARGIN), at)
            self.appended.insert(at, doc)
            first_placed = min(first_placed, at)
        if first_placed >= before:
            return "append", self.appended[before:]
        return "update", self.all
