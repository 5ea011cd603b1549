"""The passage store: one SQLite file beside the index, mapping vector rows to passages.

Row `r` of the table is vector `r` of the DiskANN index. `meta` holds build facts as text.
Readers open it read-only and may share one store between threads.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from retriever_svc.corpus.passages import Passage

SCHEMA = """
CREATE TABLE passages (row INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT NOT NULL,
                       url TEXT NOT NULL, text TEXT NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def write_store(path: Path, passages: Iterable[Passage], meta: Mapping[str, str]) -> int:
    """Create `path` (which must not exist) with `passages` as rows 0..n-1; returns n."""
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA)
        cursor = db.executemany("INSERT INTO passages VALUES (?, ?, ?, ?, ?)",
                                ((row, p.id, p.title, p.url, p.text) for row, p in enumerate(passages)))
        db.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        count = cursor.rowcount
    db.close()
    return count


class PassageStore:
    """Read-only access to a passage store."""

    def __init__(self, path: Path) -> None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no passage store at {path}")
        self.path = Path(path)
        self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM passages").fetchone()[0]

    def meta(self) -> dict[str, str]:
        with self._lock:
            return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def get(self, rows: Sequence[int]) -> list[Passage]:
        """The passages at `rows`, in that order."""
        if not rows:
            return []
        marks = ",".join("?" * len(rows))
        with self._lock:
            found = {r[0]: Passage(*r[1:]) for r in self._db.execute(
                f"SELECT row, id, title, url, text FROM passages WHERE row IN ({marks})", [int(r) for r in rows])}
        missing = [r for r in rows if int(r) not in found]
        if missing:
            raise KeyError(f"passage rows {missing} not in {self.path}")
        return [found[int(r)] for r in rows]

    def all(self) -> list[Passage]:
        with self._lock:
            return [Passage(*r) for r in self._db.execute("SELECT id, title, url, text FROM passages ORDER BY row")]

    def close(self) -> None:
        with self._lock:
            self._db.close()
