"""`streamrag index build`: HTML tree -> passages (SQLite) -> embeddings -> DiskANN disk index.

An index directory holds `passages.sqlite` (row r = vector r), `vectors.npy` (the
normalized embeddings, for exact search in benchmarks and recall reports), DiskANN's
`ann_*` files and, written last, `manifest.json`. The manifest's fingerprint covers every
input page's bytes and the build parameters: when it matches, a rebuild does nothing. A
build works in `<out>/.partial` and moves its files in only when complete; the passages it
has embedded are committed to `<out>/.embedded.sqlite` as it goes (`corpus.checkpoint`), so
a build cut short resumes where it stopped.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from retriever_svc.corpus.checkpoint import (
    COMMIT_EVERY,
    BuildCheckpoint,
    PagePassages,
    Resumed,
    build_key,
    discard_checkpoint,
    page_digest,
)
from retriever_svc.corpus.embedding import EMBEDDING_DIM
from retriever_svc.corpus.extract import extract_html, html_files
from retriever_svc.corpus.passages import DEFAULT_MAX_TOKENS, Passage, split_page
from retriever_svc.corpus.store import write_store

FORMAT_VERSION = 3            # bump when extraction, splitting, the embedding backend or the file layout changes
DEFAULT_SOURCE = Path("/usr/share/doc/python3.11/html")
DEFAULT_CORPUS = "python3.11-doc"
EMBEDDING_MODEL = "all-MiniLM-L6-v2"
MANIFEST = "manifest.json"
STORE = "passages.sqlite"
VECTORS = "vectors.npy"
INDEX_PREFIX = "ann"
SEARCH_THREADS = 8          # DiskANN scratch spaces: concurrent searches per beam width
Say = Callable[[str], None]


@dataclass(frozen=True)
class BuildParams:
    max_tokens: int = DEFAULT_MAX_TOKENS
    graph_degree: int = 64          # DiskANN R
    build_complexity: int = 128     # DiskANN L at build time
    pq_chunks: int = EMBEDDING_DIM // 4   # bytes per vector kept in memory (96: a quarter of the dims)
    alpha: float = 1.2
    embed_dtype: str = "auto"       # bfloat16 where the CPU has native bf16 (~2x faster; vectors differ by < 1e-4)


@dataclass(frozen=True)
class BuildResult:
    out: Path
    built: bool                     # False: the index was already up to date
    manifest: dict


def default_index_dir() -> Path:
    from servicekit.config import default_cache_dir

    return default_cache_dir() / "index" / "python-3.11-docs"


def quiet_diskann() -> None:
    """DiskANN logs every step through Rust tracing unless told otherwise."""
    os.environ.setdefault("RUST_LOG", "warn")


def fingerprint(source: Path, files: list[Path], params: BuildParams) -> str:
    digest = hashlib.sha256(json.dumps([FORMAT_VERSION, asdict(params)]).encode())
    for path in files:
        digest.update(path.relative_to(source).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def read_manifest(out: Path) -> dict | None:
    """The manifest of a complete index in `out`, or None."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    needed = [STORE, VECTORS, f"{INDEX_PREFIX}_disk.index", f"{INDEX_PREFIX}_metadata.bin"]
    return manifest if all((out / name).is_file() for name in needed) else None


def token_counter() -> Callable[[str], int]:
    from retriever_svc.corpus.embedding import load_embedder

    tokenizer = load_embedder().tokenizer
    return lambda text: len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def passage_input(passage: Passage) -> str:
    """What gets embedded: the title gives a passage that continues a section its context."""
    return f"{passage.title}\n\n{passage.text}"


def embed_passages(passages: list[Passage], dtype: str, progress: bool, batch: int = 256,
                   backend: str | None = None):
    """Normalized float32 embeddings by `backend` (default: `EMBED_BACKEND`), in passage order.

    Longest first in slices of `batch` (less padding per model batch; the bar moves per slice)."""
    import numpy as np
    from tqdm import tqdm

    from retriever_svc.corpus.embedding import EMBED_BACKEND, load_embedder

    embedder = load_embedder(backend or EMBED_BACKEND, dtype)
    texts = [passage_input(p) for p in passages]
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    vectors = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
    with tqdm(total=len(texts), desc="embed", unit="passage", disable=not progress) as bar:
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            vectors[rows] = embedder.encode([texts[i] for i in rows])
            bar.update(len(rows))
    return vectors


def open_disk_searcher(directory: Path, beam_width: int, size: int, nodes_to_cache: int = 2000):
    """A DiskANN `StaticDiskIndex` over the disk index in `directory` (`size` vectors)."""
    quiet_diskann()
    import diskannpy

    return diskannpy.StaticDiskIndex(str(directory), num_threads=SEARCH_THREADS, beam_width=beam_width,
                                     num_nodes_to_cache=min(nodes_to_cache, size), index_prefix=INDEX_PREFIX)


def build_disk_index(vectors, directory: Path, params: BuildParams, threads: int) -> None:
    """DiskANN's graph of `vectors` in `directory`, built in a child process (`corpus.disk_build`: the
    build holds the GIL, and a service's threads must keep answering meanwhile)."""
    from retriever_svc.corpus.disk_build import build_disk_index_in_child

    build_disk_index_in_child(vectors, directory, index_prefix=INDEX_PREFIX, complexity=params.build_complexity,
                              graph_degree=params.graph_degree, alpha=params.alpha, pq_chunks=params.pq_chunks,
                              threads=threads)
    (directory / f"{INDEX_PREFIX}_vectors.bin").unlink(missing_ok=True)   # the same data as vectors.npy


def save_index(directory: Path, passages: list[Passage], vectors, params: BuildParams, *, threads: int = 0,
               embedding_backend: str | None = None, **facts: str | int) -> dict:
    """Write a complete index of `passages` (row r embedded as `vectors[r]` by `embedding_backend`,
    default `EMBED_BACKEND`) into the empty `directory`."""
    import numpy as np

    from retriever_svc.corpus.embedding import EMBED_BACKEND

    if len(passages) != len(vectors):
        raise ValueError(f"{len(passages)} passages but {len(vectors)} vectors")
    np.save(directory / VECTORS, vectors)
    build_disk_index(vectors, directory, params, threads)
    write_store(directory / STORE, passages, {k: str(v) for k, v in facts.items()})
    manifest = {**facts, "format_version": FORMAT_VERSION, "passages": len(passages), "dim": int(vectors.shape[1]),
                "embedding_model": EMBEDDING_MODEL,
                "embedding_backend": embedding_backend or EMBED_BACKEND, "metric": "l2", "params": asdict(params),
                "built_unix": int(time.time())}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _install(partial: Path, out: Path) -> None:
    """Replace the index in `out` by the one in `partial`; the manifest goes first and comes last."""
    (out / MANIFEST).unlink(missing_ok=True)
    for old in [STORE, VECTORS, *[p.name for p in out.glob(f"{INDEX_PREFIX}_*")]]:
        (out / old).unlink(missing_ok=True)
    for new in sorted(partial.iterdir(), key=lambda p: p.name == MANIFEST):
        os.replace(new, out / new.name)
    partial.rmdir()


def build_index(source: Path = DEFAULT_SOURCE, out: Path | None = None, params: BuildParams = BuildParams(),
                *, force: bool = False, progress: bool = True, threads: int = 0,
                say: Say = lambda m: print(m, file=sys.stderr, flush=True),
                on_progress: Say | None = None, commit_every: int | None = None) -> BuildResult:
    """Build (or find up to date) the index of the HTML tree `source` in `out`.

    Embedded passages are committed to a checkpoint (`corpus.checkpoint`) every `commit_every`
    (default `COMMIT_EVERY`) passages, so a build cut short (a `down`, a crash, a SIGKILL)
    resumes from what was committed; `force` starts the embedding over. `on_progress`, when
    given, hears a one-line state ("embed 7,024/14,781 passages; resumed at 6,000 of 14,781") as the build goes.
    """
    from tqdm import tqdm

    from retriever_svc.corpus.embedding import EMBED_BACKEND

    source, out = Path(source), Path(out) if out is not None else default_index_dir()
    files = html_files(source)
    if not files:
        raise FileNotFoundError(f"no HTML pages under {source}")
    out.mkdir(parents=True, exist_ok=True)
    report = on_progress or (lambda _: None)
    with open(out / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)       # one build per directory at a time
        digest = fingerprint(source, files, params)
        manifest = read_manifest(out)
        if manifest and manifest.get("fingerprint") == digest and not force:
            say(f"index in {out} is up to date ({manifest['passages']} passages)")
            return BuildResult(out, False, manifest)
        started, seconds = time.monotonic(), {}
        partial = out / ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()

        count_tokens = token_counter()
        pages: list[PagePassages] = []
        for n, path in enumerate(tqdm(files, desc="extract", unit="page", disable=not progress)):
            if n % 50 == 0:
                report(f"extract {n}/{len(files)} pages")
            relative = path.relative_to(source).as_posix()
            page = extract_html(path.read_text(encoding="utf-8", errors="replace"), relative)
            pages.append(PagePassages(relative, page_digest(path),
                                      split_page(page, params.max_tokens, count_tokens)))
        passages = [passage for page in pages for passage in page.passages]
        if not passages:
            raise ValueError(f"the pages under {source} have no text")
        seconds["extract_split"] = time.monotonic() - started
        say(f"{len(files)} pages -> {len(passages)} passages")

        t = time.monotonic()
        checkpoint = BuildCheckpoint(out, build_key(FORMAT_VERSION, asdict(params), EMBED_BACKEND), fresh=force)
        try:
            with tqdm(total=len(passages), desc="embed", unit="passage", disable=not progress) as bar:
                def note(done: int, total: int, resumed: Resumed) -> None:
                    bar.n = done
                    bar.refresh()
                    report(f"embed {done:,}/{total:,} passages" + (f"; {resumed.note()}" if resumed.note() else ""))

                resumed = checkpoint.embed(pages, lambda batch: embed_passages(batch, params.embed_dtype, False),
                                           commit_every or COMMIT_EVERY, note)
            if resumed.committed:
                say(f"embedding {resumed.note()} passages (committed by an earlier build)")
            vectors = checkpoint.vectors(passages)
        finally:
            checkpoint.close()
        seconds["embed"] = time.monotonic() - t

        t = time.monotonic()
        report("building the DiskANN index")
        say(f"building the DiskANN disk index (R={params.graph_degree}, L={params.build_complexity})")
        corpus = DEFAULT_CORPUS if source.resolve() == DEFAULT_SOURCE.resolve() else source.resolve().name
        manifest = save_index(partial, passages, vectors, params, corpus=corpus, source=str(source.resolve()),
                              fingerprint=digest, pages=len(files), threads=threads)
        seconds["diskann_store"] = time.monotonic() - t
        seconds["total"] = time.monotonic() - started
        manifest["build_seconds"] = {k: round(v, 2) for k, v in seconds.items()}
        manifest["embedding_resumed_at"] = resumed.committed        # passages an earlier, cut-short build embedded
        manifest["passages_embedded"] = len(passages) - resumed.committed     # by this build
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _install(partial, out)
        discard_checkpoint(out)
        size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
        say(f"index built in {seconds['total']:.1f} s: {len(passages)} passages, {size / 2**20:.1f} MiB in {out}")
        return BuildResult(out, True, manifest)


def add_index_build_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag index build`."""
    defaults = BuildParams()
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="root of the HTML tree to index")
    parser.add_argument("--out", type=Path, default=None,
                        help="index directory (default: <cache>/index/python-3.11-docs)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the index is up to date")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="passage size limit (word pieces)")
    parser.add_argument("--graph-degree", type=int, default=defaults.graph_degree, help="DiskANN R")
    parser.add_argument("--build-complexity", type=int, default=defaults.build_complexity, help="DiskANN build L")
    parser.add_argument("--pq-chunks", type=int, default=defaults.pq_chunks, help="PQ bytes per vector")
    parser.add_argument("--embed-dtype", choices=["auto", "bfloat16", "float32"], default=defaults.embed_dtype,
                        help="auto: bfloat16 where the CPU computes it natively, else float32")
    parser.add_argument("--threads", type=int, default=0, help="DiskANN build threads (0: all cores)")


def run_index_build(args: argparse.Namespace) -> int:
    params = BuildParams(max_tokens=args.max_tokens, graph_degree=args.graph_degree,
                         build_complexity=args.build_complexity, pq_chunks=args.pq_chunks,
                         embed_dtype=args.embed_dtype)
    try:
        result = build_index(args.source, args.out, params, force=args.force, progress=not args.quiet,
                             threads=args.threads)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(result.out)
    return 0


if __name__ == "__main__":
    import sys

    from servicekit.config import run_command

    sys.exit(run_command("python -m retriever_svc.corpus.index", add_index_build_args, run_index_build))
