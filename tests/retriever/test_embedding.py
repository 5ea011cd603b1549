"""Tests for offline all-MiniLM-L6-v2 embeddings."""

from __future__ import annotations

import numpy as np

from retriever_svc.corpus.embedding import embed, embedding_model_path, load_embedder


def test_model_path() -> None:
    assert (embedding_model_path() / "model.safetensors").is_file()


def test_embed_similarity() -> None:
    vectors = embed(["how do I open a file in python", "reading files with open()", "the capital of France"])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2]
    assert sims[0, 1] > sims[1, 2]


def test_embedder_cached() -> None:
    assert load_embedder() is load_embedder()
    assert embed([]).shape == (0, 384)
