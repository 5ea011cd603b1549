"""The default collection (the index `streamrag index build` made) searched in Milvus.

Its passages and vectors stay in the index folder (text for the chunks, vectors for exact
search); the vectors are uploaded once into a Milvus collection named after the index's
manifest, so a rebuilt index gets a fresh one. Opening checks that Milvus holds every row
(a reconcile by row number) and waits for the index to be built over them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from retriever_svc.anns.index import AnnsIndex
from retriever_svc.milvus.connection import MilvusConnection
from retriever_svc.milvus.index import MilvusIndex
from retriever_svc.stages import Stage

INDEX_WAIT_S = 1800.0


def bundled_name(manifest: dict) -> str:
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    return f"sr_default_{digest}"


class MilvusBundledIndex(AnnsIndex):
    """`AnnsIndex` whose searches go to Milvus; exact search and passages stay local."""

    def __init__(self, directory: Path, connection: MilvusConnection,
                 report: Callable[[str], None] = lambda _: None) -> None:
        super().__init__(directory, nodes_to_cache=0)
        self.milvus = MilvusIndex(connection, bundled_name(self.manifest))
        report(f"checking {self.size} vectors in Milvus ({self.milvus.name})")
        inserted, _ = self.milvus.reconcile(np.arange(self.size, dtype=np.int64),
                                            lambda rows: np.asarray(self.vectors[rows]), self.size)
        if inserted:
            report(f"uploaded {inserted} vectors; building the {connection.index_type} index")
            self.milvus.flush()
        self.milvus.wait_indexed(INDEX_WAIT_S)
        if inserted:
            # A built index reaches the query node later (until then Milvus searches the segment through its
            # interim IVF index, nprobe 16 of 128 lists); loading again serves the built one at once.
            self.milvus.reload()

    def search(self, vector: np.ndarray, k: int, search_list_size: int, beam_width: int):
        return self.milvus.search(vector, min(k, self.size), search_list_size)

    def stages(self, vector: np.ndarray, k: int, schedule: Sequence[int], beam_width: int) -> Iterator[Stage]:
        return self.milvus.stages(vector, min(k, self.size), schedule)
