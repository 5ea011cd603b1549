"""The embedding backends: the default one gives the torch reference's vectors, from an ONNX
export that is built once per cache directory and reused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from retriever_svc.corpus import embedding
from retriever_svc.corpus.embedding import EMBEDDING_DIM, GRAPH_FILES, embed, ensure_export, load_embedder

TEXTS = ["how do I open a file in python", "reading files with open()", "the capital of France",
         "asyncio.gather(*aws, return_exceptions=False) runs awaitable objects concurrently. " * 20]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """(an empty cache directory for this module, the export count before it)."""
    patch = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("cache")
    patch.setenv("STREAMRAG_CACHE_DIR", str(path))
    patch.setattr(embedding, "_EMBEDDERS", {})
    yield path, embedding.exports_built
    patch.undo()


def test_two_loads_at_once_export_once_and_later_loads_reuse_it(cache: tuple[Path, int]) -> None:
    path, built_before = cache
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(ensure_export())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    directory = found[0]
    assert found == [directory, directory] and directory.is_relative_to(path)
    assert embedding.exports_built == built_before + 1
    assert sorted(p.name for p in directory.iterdir()) == sorted(GRAPH_FILES.values())
    assert not [p for p in directory.parent.iterdir() if p.name.startswith(".")]   # no temporary left over
    stamp = directory.stat().st_mtime_ns
    embedding._EMBEDDERS.clear()
    load_embedder()
    load_embedder("onnx-int8")
    assert embedding.exports_built == built_before + 1
    assert directory.stat().st_mtime_ns == stamp


def test_default_backend_matches_torch_float32(cache: tuple[Path, int]) -> None:
    vectors = embed(TEXTS)
    reference = embed(TEXTS, backend="torch", dtype="float32")
    assert vectors.shape == (len(TEXTS), EMBEDDING_DIM)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.sum(vectors * reference, axis=1).min() > 0.999


def test_float32_backends_agree_with_torch(cache: tuple[Path, int]) -> None:
    reference = embed(TEXTS, backend="torch", dtype="float32")
    for backend in ("onnx", "openvino"):
        assert np.sum(embed(TEXTS, backend=backend, dtype="float32") * reference, axis=1).min() > 0.9999


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown embedding backend"):
        load_embedder("tensorflow")


def test_encode_keeps_the_order_of_its_texts(cache: tuple[Path, int]) -> None:
    embedder = load_embedder()
    together = embedder.encode(TEXTS, batch_size=2)
    alone = np.stack([embedder.encode([t])[0] for t in TEXTS])
    assert np.sum(together * alone, axis=1).min() > 0.9999
