"""The collections one ANNS retriever serves: the bundled default and the user's live ones.

The default collection is the index `streamrag index build` makes (the Python docs unless
told otherwise). It is read-only, and while it is missing the retriever can build it in the
background: searches of it answer UNAVAILABLE with the build's progress until it is ready.
Live collections are folders under the registry's root, one per name.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from retriever_svc.collections.collection import Collection, IndexFactory
from retriever_svc.service import (
    CollectionExists,
    CollectionReadOnly,
    InvalidQuery,
    RetrieverUnavailable,
    UnknownCollection,
)

DEFAULT_COLLECTION = "default"
BUILD_STOP_TIMEOUT_S = 30.0     # at shutdown, the longest wait for a background build to reach its next commit
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
log = logging.getLogger(__name__)


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidQuery(f"bad collection name {name!r}: use 1-64 letters, digits, '-' or '_', "
                           "starting with a letter or digit")
    return name


def default_collections_root() -> Path:
    from servicekit.config import default_cache_dir

    return default_cache_dir() / "collections"


class BuildStopped(Exception):
    """Raised inside a background build by its progress report once the service is stopping."""


class DefaultCollection:
    """The bundled, read-only index; `index` is None until it is opened (or built)."""

    read_only = True

    def __init__(self, index=None) -> None:
        self.index = index              # an anns.index.AnnsIndex
        self.progress = ""              # while building: what the build is doing
        self.error = ""
        self._stopping = threading.Event()
        self._build: threading.Thread | None = None

    def ready(self):
        if self.index is not None:
            return self.index
        if self.error:
            raise RetrieverUnavailable(f"no default ANNS index: {self.error}")
        raise RetrieverUnavailable("the default ANNS index is still building"
                                   + (f" ({self.progress})" if self.progress else "")
                                   + "; ask with --retriever crawler meanwhile")

    def build_in_background(self, build: Callable[[Callable[[str], None]], object]) -> threading.Thread:
        """Run `build(report_progress)` in a thread; it returns the opened index. The build reports after each
        commit (corpus.checkpoint), and that is where `stop_building` stops it."""
        def run() -> None:
            try:
                self.index = build(self._report)
                self.progress = ""
            except BuildStopped:
                log.info("the default index build stopped for shutdown (%s); the next start resumes it from "
                         "its last commit", self.progress or "not started")
            except Exception as exc:      # reported through ready(), and logged
                log.exception("building the default index failed")
                self.error = f"building it failed: {exc}"

        self._build = threading.Thread(target=run, name="default-index-build", daemon=True)
        self._build.start()
        return self._build

    def _report(self, progress: str) -> None:
        if self._stopping.is_set():
            raise BuildStopped
        self.progress = progress

    def stop_building(self, timeout_s: float = BUILD_STOP_TIMEOUT_S) -> bool:
        """Stop a background build at its next report (after a commit, so nothing embedded is lost) and wait
        for it: a process must not exit with the build inside the embedding runtime's native code, which
        aborts the interpreter's shutdown (SIGABRT). True when no build is left running."""
        self._stopping.set()
        if self._build is not None:
            self._build.join(timeout_s)
        return self._build is None or not self._build.is_alive()

    def info(self) -> dict:
        state = "ready" if self.index is not None else ("failed" if self.error else "building")
        size = self.index.size if self.index is not None else 0
        files = int(self.index.manifest.get("pages", 0)) if self.index is not None else 0
        return {"name": DEFAULT_COLLECTION, "files": files, "passages": size, "disk_passages": size,
                "memory_passages": 0, "deleted_passages": 0, "read_only": True, "state": state,
                "progress": self.error or self.progress}


class CollectionRegistry:
    """Name -> collection; create, drop and list. Thread-safe."""

    def __init__(self, root: Path | None, default: DefaultCollection | None = None,
                 index_factory: IndexFactory | None = None) -> None:
        """`index_factory`: what each live collection searches through (default: `live.LiveIndex`, diskannpy)."""
        self.root = Path(root) if root is not None else None
        self.default = default or DefaultCollection()
        self.index_factory = index_factory
        self._live: dict[str, Collection] = {}
        self._lock = threading.Lock()
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            for directory in sorted(self.root.iterdir()):
                if directory.is_dir() and NAME.fullmatch(directory.name) and not directory.name.startswith("."):
                    self._live[directory.name] = Collection(directory.name, directory, index_factory)

    def searchable(self, name: str):
        """What a Retrieve of collection `name` searches ("" = the default)."""
        name = name or DEFAULT_COLLECTION
        if name == DEFAULT_COLLECTION:
            return self.default.ready()
        return self.live(name)

    def live(self, name: str) -> Collection:
        check_name(name)
        if name == DEFAULT_COLLECTION:
            raise CollectionReadOnly(f"the {DEFAULT_COLLECTION!r} collection is the bundled index, built by "
                                     "`streamrag index build`; add your files to a collection of your own "
                                     "(`streamrag collection create NAME`)")
        with self._lock:
            collection = self._live.get(name)
        if collection is None:
            raise UnknownCollection(f"no collection {name!r}; `streamrag collection list` shows them")
        return collection

    def create(self, name: str) -> Collection:
        check_name(name)
        if self.root is None:
            raise CollectionReadOnly("this retriever serves no live collections (started without --collections)")
        with self._lock:
            if name == DEFAULT_COLLECTION or name in self._live:
                raise CollectionExists(f"collection {name!r} exists")
            directory = self.root / name
            shutil.rmtree(directory, ignore_errors=True)      # a drop interrupted by a crash
            directory.mkdir()
            collection = self._live[name] = Collection(name, directory, self.index_factory)
        return collection

    def drop(self, name: str) -> dict:
        collection = self.live(name)
        collection.index.drop()         # what lives outside the folder first: if that fails, nothing is gone
        with self._lock:
            self._live.pop(name, None)
        info = collection.info()
        # Rename first: a crash mid-delete leaves a hidden folder, never a half collection.
        trash = collection.directory.with_name(f".dropped-{name}")
        shutil.rmtree(trash, ignore_errors=True)
        collection.close()
        collection.directory.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
        return info

    def infos(self) -> list[dict]:
        with self._lock:
            live = list(self._live.values())
        return [{**self.default.info(), "is_default": True},
                *({**c.info(), "is_default": False} for c in sorted(live, key=lambda c: c.name))]

    def collections(self) -> list[Collection]:
        with self._lock:
            return list(self._live.values())

    def close(self) -> None:
        for collection in self.collections():
            collection.close()
