"""`streamrag serve retriever --kind anns --backend milvus --milvus-uri URI`: the ANNS retriever on Milvus.

Everything but the search structure is the diskannpy backend's: the `Retrieve` stream
(`anns.AnnsBackend`: staged early results as UPDATE chunks), the collections registry,
servicer and SQLite stores, the embedder. Live collections search through
`live.MilvusLiveIndex`; the default collection through `bundled.MilvusBundledIndex`, opened
in the background (uploading the vectors the first time) while the live ones serve.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from protos import retriever_pb2
from retriever_svc.anns.backend import AnnsBackend, parse_beam_width, parse_schedule
from retriever_svc.collections.registry import CollectionRegistry, DefaultCollection, default_collections_root
from retriever_svc.corpus.index import default_index_dir, read_manifest
from retriever_svc.milvus.bundled import MilvusBundledIndex
from retriever_svc.milvus.connection import MilvusConnection, MilvusSettings
from retriever_svc.milvus.live import MilvusLiveIndex
from retriever_svc.service import RetrieverUnavailable

log = logging.getLogger(__name__)


class MilvusAnnsBackend(AnnsBackend):
    """`AnnsBackend` whose collections live in Milvus; Describe says where."""

    def __init__(self, registry: CollectionRegistry, connection: MilvusConnection, **kwargs) -> None:
        super().__init__(registry, **kwargs)
        self.connection = connection

    def describe(self) -> retriever_pb2.RetrieverInfo:
        info = super().describe()
        info.facts.update({"backend": "milvus", "milvus_uri": self.connection.uri,
                           "milvus_index": self.connection.index_type,
                           "milvus_version": self.connection.server_version})
        return info

    def warm_up(self) -> None:
        self.embed("warm up")


def settings_from_args(args: argparse.Namespace) -> MilvusSettings:
    if not args.milvus_uri:
        raise SystemExit("error: --backend milvus needs --milvus-uri (e.g. http://127.0.0.1:19530)")
    return MilvusSettings(args.milvus_uri, args.milvus_index, float(args.milvus_timeout))


def build_backend(args: argparse.Namespace) -> MilvusAnnsBackend:
    try:
        schedule, width = parse_schedule(str(args.l_schedule)), parse_beam_width(args.beam_width)
        connection = MilvusConnection(settings_from_args(args))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    try:
        connection.connect()
    except RetrieverUnavailable as exc:
        raise SystemExit(f"error: {exc}") from None
    directory = args.index or default_index_dir()
    default = DefaultCollection()
    if str(directory) == "none":
        default.error = "this retriever was started without one (--index none)"
    elif read_manifest(directory) is None and args.build_from is None:
        raise SystemExit(f"error: no complete index in {directory}: run `streamrag index build` "
                         "(or start with --build-from SOURCE to build it in the background)")
    registry = CollectionRegistry(args.collections or default_collections_root(), default,
                                  index_factory=lambda folder, store: MilvusLiveIndex(folder, store, connection))
    backend = MilvusAnnsBackend(registry, connection, schedule=schedule, beam_width=width)
    backend.warm_up()
    if not default.error:
        default.build_in_background(lambda report: _open_default(args.build_from, Path(directory), connection, report))
    return backend


def _open_default(source: Path | None, directory: Path, connection: MilvusConnection, report) -> MilvusBundledIndex:
    """Build the local index first if it is missing (its passages and vectors), then open it in Milvus."""
    if read_manifest(directory) is None:
        from retriever_svc.corpus.index import build_index

        build_index(source, directory, progress=False, say=report, on_progress=report)
    return MilvusBundledIndex(directory, connection, report)
