"""Retriever tests.

For the ANNS tests: `build_tiny_index` gives the real DiskANN index of
tests/support/tiny_corpus.py (five pages, one passage each), quietly; `build_random_index`
a harder one over random vectors, where small search lists really miss neighbours. For the
corpus web server's tests: `http_get` (conftest.py gives the `corpus` fixture).
Imports are inside the helpers so the package stays free to import for the other suites.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_index(root: Path) -> Path:
    """Build the tiny corpus under `root/site` and its index in `root/index`; returns the index."""
    from retriever_svc.corpus.index import build_index
    from tests.support.tiny_corpus import build_tiny_corpus

    site = build_tiny_corpus(root / "site")
    return build_index(site, root / "index", progress=False, threads=1, say=lambda _: None).out


def build_random_index(directory: Path, count: int = 1500, dim: int = 384, seed: int = 0) -> Path:
    """An index over `count` random unit vectors (passage r reads "passage r")."""
    import numpy as np

    from retriever_svc.corpus.index import BuildParams, save_index
    from retriever_svc.corpus.passages import Passage

    vectors = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    passages = [Passage(f"random:{r}", f"Random {r}", f"random/{r}.html", f"passage {r}") for r in range(count)]
    directory.mkdir(parents=True, exist_ok=True)
    save_index(directory, passages, vectors, BuildParams(graph_degree=16, build_complexity=32, pq_chunks=16),
               threads=1, corpus="random")
    return directory


def http_get(server, path: str) -> tuple[int, str, bytes]:
    """GET `path` from a running `CorpusServer`: (status, content type, body)."""
    import http.client

    connection = http.client.HTTPConnection(server.host, server.port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        connection.close()
