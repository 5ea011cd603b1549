"""Our runner against Hugging Face transformers on the real SmolLM2-135M-Instruct weights.

fp32: greedy tokens are identical to ``generate(do_sample=False)`` for 32 new tokens, for a
short chat prompt and for a ~2,000-token prompt prefilled in 512-token chunks.
bf16: the first token matches, and the next-token logits stay close to HF's fp32 logits.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from inference_svc.engine.model_runner import ChunkInput, ModelRunner

NEW_TOKENS = 32
LONG_PROMPT_TOKENS = 2000
BLOCK_SIZE = 16
NUM_BLOCKS = (LONG_PROMPT_TOKENS + NEW_TOKENS) // BLOCK_SIZE + 2

# Max |our bf16 logits - HF fp32 logits| measured here: 0.45 on the short chat prompt, 0.30
# on the 2,000-token prompt, 0.31-0.50 on three more chat prompts (logits span about -10..34).
# That is bf16 rounding through 30 layers: transformers' own bf16 model is off from its fp32
# by the same amounts (our bf16 logits equal its bf16 logits bit for bit on this CPU). 1.5
# leaves 3x margin and still catches real bugs (a wrong RoPE, mask or cache slot moves logits
# by several units). fp32 against fp32 differs by about 1e-5.
BF16_LOGIT_ATOL = 1.5


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


@pytest.fixture(scope="module")
def hf_model(embedded_model_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # always produce NEW_TOKENS tokens
    return model


def _runner(model_dir: Path, dtype: torch.dtype) -> ModelRunner:
    return ModelRunner(model_dir, dtype=dtype, block_size=BLOCK_SIZE, num_device_blocks=NUM_BLOCKS, num_cpu_blocks=0)


@pytest.fixture(scope="module")
def runner_fp32(embedded_model_dir: Path) -> ModelRunner:
    return _runner(embedded_model_dir, torch.float32)


@pytest.fixture(scope="module")
def runner_bf16(embedded_model_dir: Path) -> ModelRunner:
    return _runner(embedded_model_dir, torch.bfloat16)


def _chat_ids(tokenizer, content: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def _long_prompt_ids(tokenizer) -> list[int]:
    """About 2,000 tokens of real prose: the standard library's module docs, in a chat turn."""
    import argparse
    import collections
    import json
    import subprocess

    docs = "\n\n" + "\n\n".join(inspect.getdoc(m) or "" for m in (argparse, subprocess, json, collections))
    doc_ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    turn = _chat_ids(tokenizer, "Summarise this documentation:")
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cut = len(turn) - 1 - turn[::-1].index(end_of_turn)
    prefix, suffix = turn[:cut], turn[cut:]  # the document goes right after the user's text
    room = LONG_PROMPT_TOKENS - len(prefix) - len(suffix)
    assert len(doc_ids) >= room, "not enough documentation text for the long prompt"
    return prefix + doc_ids[:room] + suffix


def _hf_greedy(hf_model, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    with torch.inference_mode():
        out = hf_model.generate(
            torch.tensor([ids]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(ids) :].tolist(), out.logits[0][0].float()


def _our_greedy(runner: ModelRunner, ids: list[int], chunk: int = 512) -> tuple[list[int], torch.Tensor]:
    table = list(range(NUM_BLOCKS))
    for start in range(0, len(ids), chunk):
        piece = ids[start : start + chunk]
        logits = runner.execute([ChunkInput(piece, start, table, want_logits=start + chunk >= len(ids))])
    first_logits = logits[0].cpu()
    tokens = [int(logits[0].argmax())]
    for pos in range(len(ids), len(ids) + NEW_TOKENS - 1):
        logits = runner.execute([ChunkInput([tokens[-1]], pos, table, want_logits=True)])
        tokens.append(int(logits[0].argmax()))
    return tokens, first_logits


@pytest.fixture(scope="module")
def short_ids(tokenizer) -> list[int]:
    return _chat_ids(tokenizer, "What is the capital of France? Answer in one sentence, then explain why.")


@pytest.fixture(scope="module")
def long_ids(tokenizer) -> list[int]:
    return _long_prompt_ids(tokenizer)


@pytest.fixture(scope="module")
def hf_short(hf_model, short_ids):
    return _hf_greedy(hf_model, short_ids)


@pytest.fixture(scope="module")
def hf_long(hf_model, long_ids):
    return _hf_greedy(hf_model, long_ids)


def test_short_chat_prompt_greedy_tokens_equal_transformers_fp32(runner_fp32, short_ids, hf_short):
    ours, _ = _our_greedy(runner_fp32, short_ids)
    assert ours == hf_short[0]


def test_long_prompt_chunked_prefill_greedy_tokens_equal_transformers_fp32(runner_fp32, long_ids, hf_long):
    assert len(long_ids) == LONG_PROMPT_TOKENS
    ours, logits = _our_greedy(runner_fp32, long_ids, chunk=512)
    assert ours == hf_long[0]
    torch.testing.assert_close(logits, hf_long[1], atol=1e-3, rtol=0)


@pytest.mark.parametrize("which", ["short", pytest.param("long", marks=pytest.mark.slow)])   # long: half a minute
def test_bf16_first_token_and_logits_match_transformers_fp32(
    runner_bf16, which, short_ids, long_ids, hf_short, hf_long
):
    ids, (hf_tokens, hf_logits) = (short_ids, hf_short) if which == "short" else (long_ids, hf_long)
    table = list(range(NUM_BLOCKS))
    logits = runner_bf16.execute([ChunkInput(ids, 0, table, want_logits=True)])[0].cpu()
    assert int(logits.argmax()) == hf_tokens[0]
    diff = (logits - hf_logits).abs().max().item()
    assert diff < BF16_LOGIT_ATOL, f"max |bf16 - hf fp32| = {diff:.3f}"


TINY = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=256,
)
FAMILIES = {
    "llama-llama3-rope-untied": (
        "llama",
        dict(
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "llama-linear-rope-attention-bias": (
        "llama",
        dict(attention_bias=True, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    ),
    "qwen2-qkv-bias-tied-dynamic-rope": (
        "qwen2",
        dict(tie_word_embeddings=True, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
    ),
    "mistral-yarn-rope": (
        "mistral",
        dict(
            sliding_window=None,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tiny_random_model_families_match_transformers_fp32(family, tmp_path):
    """Random weights saved by transformers, loaded by us: logits agree (RoPE variants, biases, tying)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, extra = FAMILIES[family]
    config = AutoConfig.for_model(model_type, **TINY, **extra)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.15)  # biases and norms too, so every weight matters
    hf.save_pretrained(tmp_path)
    ids = torch.randint(0, TINY["vocab_size"], (100,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0]

    runner = ModelRunner(tmp_path, dtype=torch.float32, block_size=8, num_device_blocks=16, num_cpu_blocks=0)
    assert runner.config.qkv_bias == (model_type == "qwen2" or extra.get("attention_bias", False))
    table = list(range(15, -1, -1))
    first = runner.execute([ChunkInput(ids[:70], 0, table, True)])[0]
    last = runner.execute([ChunkInput(ids[70:], 70, table, True)])[0]  # positions past the original RoPE range
    torch.testing.assert_close(first, expected[69], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(last, expected[99], atol=1e-4, rtol=1e-4)
