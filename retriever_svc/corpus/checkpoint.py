"""An index build's embedded passages, kept as they are made, so a build cut short resumes.

The checkpoint is a collection store (`retriever_svc.corpus.collection_store.CollectionStore`, the
same SQLite file a live collection keeps) beside the index: each page's passages and vectors
are committed in one transaction once embedded, so after a `down`, a crash or a SIGKILL the
next build embeds only the pages the checkpoint does not hold (same path, same SHA-256, same
passage count). Its `build` meta key names what the vectors depend on (format version, build
parameters, embedding backend); a checkpoint of another kind is discarded. The finished
index's rows are read back by passage id, in the from-scratch order, and the checkpoint is
deleted once the index is installed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retriever_svc.corpus.collection_store import CollectionStore
from retriever_svc.corpus.passages import Passage

CHECKPOINT = ".embedded.sqlite"
BUILD_KEY = "build"
COMMIT_EVERY = 256        # passages embedded between two commits (whole pages, at least one page)
# passages -> their normalized vectors, row by row
EmbedPassages = Callable[[list[Passage]], np.ndarray]


@dataclass(frozen=True)
class PagePassages:
    path: str                 # relative to the source root
    sha256: str               # of the page's bytes
    passages: list[Passage]


@dataclass(frozen=True)
class Resumed:
    committed: int            # passages already embedded when this build started
    total: int

    def note(self) -> str:
        return f"resumed at {self.committed:,} of {self.total:,}" if self.committed else ""


def page_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def checkpoint_files(out: Path) -> list[Path]:
    """The checkpoint's SQLite file and its write-ahead log files."""
    base = Path(out) / CHECKPOINT
    return [base, base.with_name(base.name + "-wal"), base.with_name(base.name + "-shm")]


def discard_checkpoint(out: Path) -> None:
    for path in checkpoint_files(out):
        path.unlink(missing_ok=True)


class BuildCheckpoint:
    """The embedded passages of one index directory's build in progress."""

    def __init__(self, out: Path, build_key: str, fresh: bool = False) -> None:
        """Open (or start) the checkpoint in `out`; with `fresh`, or when it was made for another `build_key`,
        start from nothing."""
        if fresh:
            discard_checkpoint(out)
        self.out = Path(out)
        self.store = CollectionStore(self.out / CHECKPOINT)
        if self.store.meta(BUILD_KEY, build_key) != build_key:
            self.store.close()
            discard_checkpoint(out)
            self.store = CollectionStore(self.out / CHECKPOINT)
        self.store.set_meta({BUILD_KEY: build_key})

    def missing(self, pages: list[PagePassages]) -> list[PagePassages]:
        """The pages whose passages are not (all, as they are now) committed."""
        return [page for page in pages if page.passages
                and self.store.file(page.path) != (page.sha256, len(page.passages))]

    def embed(self, pages: list[PagePassages], embed: EmbedPassages, commit_every: int = COMMIT_EVERY,
              on_progress: Callable[[int, int, Resumed], None] = lambda done, total, resumed: None) -> Resumed:
        """Embed what the checkpoint lacks, `commit_every` passages (whole pages) at a time, committing page by
        page; `on_progress(done, total, resumed)` after each commit. Returns where it resumed."""
        total = sum(len(page.passages) for page in pages)
        todo = self.missing(pages)
        resumed = Resumed(total - sum(len(page.passages) for page in todo), total)
        done = resumed.committed
        on_progress(done, total, resumed)
        group: list[PagePassages] = []
        for i, page in enumerate(todo):
            group.append(page)
            if sum(len(p.passages) for p in group) >= commit_every or i == len(todo) - 1:
                vectors = embed([passage for p in group for passage in p.passages])
                row = 0
                for p in group:
                    self.store.put_file(p.path, p.sha256, p.passages, vectors[row:row + len(p.passages)])
                    row += len(p.passages)
                done += row
                group = []
                on_progress(done, total, resumed)
        return resumed

    def vectors(self, passages: list[Passage]) -> np.ndarray:
        """The committed vectors of `passages`, row r for passage r (KeyError when one is missing)."""
        pids, vectors = self.store.vectors()
        stored = self.store.passages(pids.tolist())
        row_of = {stored[pid].id: row for row, pid in enumerate(pids.tolist())}
        missing = [p.id for p in passages if p.id not in row_of]
        if missing:
            raise KeyError(f"{len(missing)} passages were never embedded, e.g. {missing[:3]}")
        return np.ascontiguousarray(vectors[[row_of[p.id] for p in passages]])

    def close(self) -> None:
        self.store.close()


def build_key(*parts: object) -> str:
    return json.dumps(parts, sort_keys=True)
