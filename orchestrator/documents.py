"""One merged document list from one or two retrievers, and how to tell the engine about it.

The ANNS retriever sends UPDATE chunks (its complete current top-k); the crawler sends
APPEND chunks (new pages). The merged list is the ANNS part followed by the crawler part,
so a crawler page is always an `append` at the end, and an ANNS refinement is an `update`
of the whole list (the engine keeps KV up to the token LCP, so an unchanged head is free).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protos import common_pb2, retriever_pb2


@dataclass
class MergedDocuments:
    ranked: list[common_pb2.Document] = field(default_factory=list)     # from UPDATE chunks
    appended: list[common_pb2.Document] = field(default_factory=list)   # from APPEND chunks

    @property
    def all(self) -> list[common_pb2.Document]:
        return self.ranked + self.appended

    def apply(self, chunk: retriever_pb2.ContextChunk) -> tuple[str, list[common_pb2.Document]]:
        """Fold a chunk in. Returns ("append", new docs) / ("update", the whole list) / ("none", [])."""
        seen = {doc.id for doc in self.all}
        if chunk.mode == retriever_pb2.CHUNK_MODE_UPDATE:
            new_ranked = list(chunk.documents)
            if [d.id for d in new_ranked] == [d.id for d in self.ranked]:
                return "none", []
            ranked_ids = {d.id for d in new_ranked}
            self.appended = [d for d in self.appended if d.id not in ranked_ids]  # no document twice
            self.ranked = new_ranked
            return "update", self.all
        fresh = []
        for doc in chunk.documents:
            if doc.id not in seen:
                seen.add(doc.id)
                fresh.append(doc)
        self.appended.extend(fresh)
        return ("append", fresh) if fresh else ("none", [])
