"""One live collection: a folder with its SQLite store and its search index; files in, files out.

Adding a file: load it (`corpus.loaders`), split it into passages (`corpus.passages`), embed
them, commit them to the store in one transaction, publish them to the index, and only then
answer. An unchanged file (same SHA-256) is skipped before any of that; a changed one
replaces its passages in the same transaction.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retriever_svc.collections.live import LiveIndex
from retriever_svc.collections.search_index import SearchIndex
from retriever_svc.corpus.collection_store import CollectionStore
from retriever_svc.corpus.loaders import UnreadableFile, load_page
from retriever_svc.corpus.passages import DEFAULT_MAX_TOKENS, Passage, TokenCounter, split_page
from retriever_svc.stages import Stage

STORE_FILE = "collection.sqlite"
# passages -> their normalized vectors, row by row
EmbedPassages = Callable[[list[Passage]], np.ndarray]


# (collection folder, its store) -> its index
IndexFactory = Callable[[Path, CollectionStore], SearchIndex]


class Added:
    ADDED, REPLACED, UNCHANGED, FAILED = "added", "replaced", "unchanged", "failed"


@dataclass(frozen=True)
class AddResult:
    path: str
    status: str                 # one of Added's
    passages: int
    message: str = ""
    seconds: float = 0.0


def file_passages(path: str, content: bytes, sha256: str, count_tokens: TokenCounter,
                  max_tokens: int = DEFAULT_MAX_TOKENS) -> list[Passage]:
    """The passages of one file; ids carry the content hash, so a changed file never reuses one."""
    page = load_page(path, content)
    return [Passage(f"{path}@{sha256[:12]}:{i}", p.title, p.url, p.text)
            for i, p in enumerate(split_page(page, max_tokens, count_tokens))]


class Collection:
    """A collection folder, opened: the store is the truth, the index is rebuilt from it on open."""

    read_only = False

    def __init__(self, name: str, directory: Path, index_factory: IndexFactory | None = None) -> None:
        self.name = name
        self.directory = Path(directory)
        self.store = CollectionStore(self.directory / STORE_FILE)
        self.index: SearchIndex = (index_factory or LiveIndex)(self.directory, self.store)

    @property
    def size(self) -> int:
        return self.index.size

    def stages(self, vector: np.ndarray, k: int, schedule: Sequence[int], beam_width: int) -> Iterator[Stage]:
        return self.index.stages(vector, k, schedule, beam_width)

    def exact(self, vector: np.ndarray, k: int) -> list[int]:
        return self.index.exact(vector, k)

    def passages(self, rows: Sequence[int]) -> dict[int, Passage]:
        return self.store.passages(rows)

    def add_file(self, path: str, content: bytes, count_tokens: TokenCounter, embed: EmbedPassages) -> AddResult:
        """Index one file; an unreadable one is reported, never raised."""
        started = time.monotonic()
        sha256 = hashlib.sha256(content).hexdigest()
        previous = self.store.file(path)
        if previous is not None and previous[0] == sha256:
            return AddResult(path, Added.UNCHANGED, previous[1])
        try:
            passages = file_passages(path, content, sha256, count_tokens)
        except UnreadableFile as exc:
            return AddResult(path, Added.FAILED, 0, str(exc))
        if not passages:
            return AddResult(path, Added.FAILED, 0, "no text to index")
        vectors = embed(passages)
        with self.index.writing():
            change = self.store.put_file(path, sha256, passages, vectors)
            self.index.apply(change, vectors)
        status = Added.REPLACED if change.replaced else Added.ADDED
        return AddResult(path, status, len(passages), seconds=time.monotonic() - started)

    def remove(self, paths: Sequence[str]) -> tuple[list[str], int]:
        """Remove files (a folder path: every file under it); (files removed, passages removed)."""
        files = sorted({found for path in paths for found in self.store.paths_under(path)})
        with self.index.writing():
            removed, pids = self.store.remove_files(files)
            self.index.remove(pids)
        return removed, len(pids)

    def info(self) -> dict:
        files, passages = self.store.counts()
        return {"name": self.name, "files": files, "passages": passages, **self.index.counts(),
                "read_only": False, "state": "merging" if self.index.merging else "ready", "progress": ""}

    def close(self) -> None:
        self.store.close()
