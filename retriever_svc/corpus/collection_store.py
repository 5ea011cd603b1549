"""A collection's durable state: one SQLite file holding its files, passages and vectors.

This file is the source of truth. The search structures (a DiskANN disk index over a
snapshot, an in-memory part for what came after it) are rebuilt from it after a restart,
so anything committed here survives a SIGKILL. A file is added or removed in one
transaction: its passages are all there or none are, never half of them.

Passage ids (`pid`) grow and are never reused, so a disk index built from a snapshot
names its passages by pid, and "added after the snapshot" is `pid > watermark`.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retriever_svc.corpus.embedding import EMBEDDING_DIM
from retriever_svc.corpus.passages import Passage

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, sha256 TEXT NOT NULL, passages INTEGER NOT NULL,
                                  added_unix INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS passages (pid INTEGER PRIMARY KEY AUTOINCREMENT, path TEXT NOT NULL, id TEXT NOT NULL,
                                     title TEXT NOT NULL, url TEXT NOT NULL, text TEXT NOT NULL,
                                     vector BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS passages_by_path ON passages (path);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class FileChange:
    """What committing one file did."""

    replaced: bool              # the file was there with other content
    removed_pids: list[int]     # its old passages
    added_pids: list[int]       # its new passages, in order


class CollectionStore:
    """The SQLite store of one collection; every method is one transaction, safe across threads."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")      # a commit is on disk before its ack
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    # ---- reads ----
    def file(self, path: str) -> tuple[str, int] | None:
        """(SHA-256, passages) of an indexed file, or None."""
        with self._lock:
            row = self._db.execute("SELECT sha256, passages FROM files WHERE path = ?", (path,)).fetchone()
        return (row[0], row[1]) if row else None

    def counts(self) -> tuple[int, int]:
        """(files, passages)."""
        with self._lock:
            files = self._db.execute("SELECT COUNT(*) FROM files").fetchone()[0]
            passages = self._db.execute("SELECT COUNT(*) FROM passages").fetchone()[0]
        return files, passages

    def paths_under(self, path: str) -> list[str]:
        """`path` itself if it is a file of the collection, and every file below it as a folder."""
        folder = path.rstrip("/") + "/"
        with self._lock:
            rows = self._db.execute(
                "SELECT path FROM files WHERE path = ? OR substr(path, 1, ?) = ? ORDER BY path",
                (path, len(folder), folder)).fetchall()
        return [row[0] for row in rows]

    def passages(self, pids: Sequence[int]) -> dict[int, Passage]:
        """The passages still in the store among `pids` (a removed one is simply absent)."""
        if not pids:
            return {}
        marks = ",".join("?" * len(pids))
        with self._lock:
            rows = self._db.execute(f"SELECT pid, id, title, url, text FROM passages WHERE pid IN ({marks})",
                                    [int(p) for p in pids]).fetchall()
        return {row[0]: Passage(*row[1:]) for row in rows}

    def vectors(self, after_pid: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(pids, vectors) of every passage with pid > `after_pid`, by pid."""
        with self._lock:
            rows = self._db.execute("SELECT pid, vector FROM passages WHERE pid > ? ORDER BY pid",
                                    (after_pid,)).fetchall()
        pids = np.array([row[0] for row in rows], dtype=np.int64)
        vectors = np.frombuffer(b"".join(row[1] for row in rows), dtype=np.float32).reshape(len(rows), EMBEDDING_DIM)
        return pids, vectors

    def live_pids(self, pids: np.ndarray) -> np.ndarray:
        """The subset of `pids` still in the store."""
        with self._lock:
            live = {row[0] for row in self._db.execute("SELECT pid FROM passages")}
        return np.array([p for p in pids.tolist() if p in live], dtype=np.int64)

    def max_pid(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'passages'").fetchone()
        return int(row[0]) if row else 0

    def meta(self, key: str, default: str = "") -> str:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    # ---- writes ----
    def put_file(self, path: str, sha256: str, passages: Sequence[Passage], vectors: np.ndarray) -> FileChange:
        """Replace whatever `path` had by `passages` (row i embedded as `vectors[i]`), atomically."""
        if len(passages) != len(vectors):
            raise ValueError(f"{len(passages)} passages but {len(vectors)} vectors")
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        with self._lock, self._transaction():
            old = [row[0] for row in self._db.execute("SELECT pid FROM passages WHERE path = ?", (path,))]
            self._db.execute("DELETE FROM passages WHERE path = ?", (path,))
            added = []
            for passage, vector in zip(passages, vectors, strict=True):
                cursor = self._db.execute(
                    "INSERT INTO passages (path, id, title, url, text, vector) VALUES (?, ?, ?, ?, ?, ?)",
                    (path, passage.id, passage.title, passage.url, passage.text, vector.tobytes()))
                added.append(int(cursor.lastrowid))
            replaced = self._db.execute("DELETE FROM files WHERE path = ?", (path,)).rowcount > 0
            self._db.execute("INSERT INTO files VALUES (?, ?, ?, ?)", (path, sha256, len(passages), int(time.time())))
        return FileChange(replaced, old, added)

    def remove_files(self, paths: Iterable[str]) -> tuple[list[str], list[int]]:
        """Remove `paths` (files of the collection) and their passages, atomically: (paths, pids)."""
        paths = list(paths)
        removed: list[int] = []
        with self._lock, self._transaction():
            for path in paths:
                removed += [row[0] for row in self._db.execute("SELECT pid FROM passages WHERE path = ?", (path,))]
                self._db.execute("DELETE FROM passages WHERE path = ?", (path,))
                self._db.execute("DELETE FROM files WHERE path = ?", (path,))
        return paths, removed

    def set_meta(self, values: dict[str, str]) -> None:
        with self._lock, self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK when the block raises."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()
