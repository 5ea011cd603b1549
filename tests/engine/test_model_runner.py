"""ModelRunner on the real SmolLM2-135M-Instruct (fp32): paging, packing, swap, copy, LCP cuts.

Each test compares the runner with itself computed another way (one-shot vs chunked,
packed vs alone, swapped vs never swapped), so the expected values need no reference model.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from inference_svc.engine.model_runner import ChunkInput, ModelRunner

BLOCK_SIZE = 16
NUM_BLOCKS = 160
TEXT = (
    "The river bends twice before it reaches the old mill, where the water slows and turns green. "
    "Every spring the miller's daughter counts the herons that nest in the reeds, and every spring "
    "the number is different: eleven one year, four the next, once none at all. Nobody in the village "
    "knows why they come or where they go when the leaves fall. "
)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    # fp32; different batch shapes may pick different matmul blockings (differences ~1e-5).
    torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-4)


@pytest.fixture(scope="module")
def runner(embedded_model_dir: Path) -> ModelRunner:
    return ModelRunner(
        embedded_model_dir, dtype=torch.float32, block_size=BLOCK_SIZE, num_device_blocks=NUM_BLOCKS, num_cpu_blocks=16
    )


@pytest.fixture(scope="module")
def tokens(embedded_model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(embedded_model_dir)(TEXT * 4)["input_ids"]
    assert len(ids) >= 250
    return ids


class Blocks:
    """Hands out disjoint device block ids so tests never share cache space by accident."""

    def __init__(self) -> None:
        self.free = list(range(NUM_BLOCKS))
        random.Random(0).shuffle(self.free)  # non-contiguous, unordered tables

    def take(self, n: int) -> list[int]:
        out, self.free = self.free[:n], self.free[n:]
        return out


def blocks_for(n_tokens: int) -> int:
    return -(-n_tokens // BLOCK_SIZE)


def prefill(runner: ModelRunner, ids: list[int], table: list[int], chunk: int | None = None) -> torch.Tensor:
    """Prefill ``ids`` (in chunks of ``chunk``) and return the last token's logits ``[vocab]``."""
    chunk = chunk or len(ids)
    for start in range(0, len(ids), chunk):
        logits = runner.execute([ChunkInput(ids[start : start + chunk], start, table, start + chunk >= len(ids))])
    return logits[0]


def decode(runner: ModelRunner, next_ids: list[int], start: int, table: list[int]) -> list[torch.Tensor]:
    """Feed ``next_ids`` one at a time from position ``start``; the logits after each."""
    return [runner.execute([ChunkInput([t], start + i, table, True)])[0] for i, t in enumerate(next_ids)]


def test_chunked_prefill_over_shuffled_blocks_equals_one_shot(runner, tokens):
    blocks = Blocks()
    ids = tokens[:203]
    one_shot_table, table = blocks.take(blocks_for(206)), blocks.take(blocks_for(206))
    one_shot = prefill(runner, ids, one_shot_table)
    for chunk in (37, 64, 100):
        assert_same(prefill(runner, ids, table, chunk=chunk), one_shot)
    # and decoding on from the chunked cache equals decoding on from the one-shot cache
    cont = tokens[203:206]
    assert_same(torch.stack(decode(runner, cont, 203, table)), torch.stack(decode(runner, cont, 203, one_shot_table)))


def test_packed_step_equals_each_sequence_alone(runner, tokens):
    blocks = Blocks()
    p1, p2 = tokens[:40], tokens[50:120]
    p3_prefix, p3_chunk = tokens[10:42], tokens[42:67]  # a second chunk, starting at position 32
    d1_prefix, d1_tok = tokens[100:120], tokens[120]
    d2_prefix, d2_tok = tokens[5:38], tokens[38]

    def tables():
        return {
            "p1": blocks.take(blocks_for(40)),
            "p2": blocks.take(blocks_for(70)),
            "p3": blocks.take(blocks_for(57)),
            "d1": blocks.take(blocks_for(21)),
            "d2": blocks.take(blocks_for(34)),
        }

    alone, packed = tables(), tables()
    for t in (alone, packed):  # what earlier steps left in the cache
        prefill(runner, p3_prefix, t["p3"])
        prefill(runner, d1_prefix, t["d1"])
        prefill(runner, d2_prefix, t["d2"])
    expected = {
        "p1": prefill(runner, p1, alone["p1"]),
        "p3": runner.execute([ChunkInput(p3_chunk, 32, alone["p3"], True)])[0],
        "d1": decode(runner, [d1_tok], 20, alone["d1"])[0],
        "d2": decode(runner, [d2_tok], 33, alone["d2"])[0],
    }
    got = runner.execute(
        [
            ChunkInput(p1, 0, packed["p1"], want_logits=True),
            ChunkInput([d1_tok], 20, packed["d1"], want_logits=True),
            ChunkInput(p2, 0, packed["p2"], want_logits=False),
            ChunkInput(p3_chunk, 32, packed["p3"], want_logits=True),
            ChunkInput([d2_tok], 33, packed["d2"], want_logits=True),
        ]
    )
    assert got.shape == (4, runner.config.vocab_size) and got.dtype == torch.float32
    for row, name in enumerate(["p1", "d1", "p3", "d2"]):
        assert_same(got[row], expected[name])
    # p2 was computed even without logits: its cache continues like a one-shot p2.
    p2_alone = blocks.take(blocks_for(71))
    prefill(runner, p2, p2_alone)
    assert_same(decode(runner, [tokens[120]], 70, packed["p2"])[0], decode(runner, [tokens[120]], 70, p2_alone)[0])


def test_batched_decodes_of_unequal_lengths_read_only_their_own_blocks(runner, tokens):
    blocks = Blocks()
    runner.kv_cache.device_pool.fill_(float("nan"))  # any read outside a sequence's context poisons it
    short, long_ = tokens[:5], tokens[20:90]
    t_short, t_long = blocks.take(1), blocks.take(blocks_for(71))
    prefill(runner, short, t_short)
    prefill(runner, long_, t_long)
    both = runner.execute([ChunkInput([tokens[5]], 5, t_short, True), ChunkInput([tokens[90]], 70, t_long, True)])
    assert torch.isfinite(both).all()
    assert_same(both[1], decode(runner, [tokens[90]], 70, t_long)[0])
    assert_same(both[0], decode(runner, [tokens[5]], 5, t_short)[0])


def test_swap_out_scribble_swap_in_elsewhere_continues_identically(runner, tokens):
    blocks = Blocks()
    ids, cont = tokens[:75], tokens[75:80]
    ref_table = blocks.take(blocks_for(80))
    prefill(runner, ids, ref_table)
    expected = decode(runner, cont, 75, ref_table)

    table = blocks.take(blocks_for(80))
    prefill(runner, ids, table)
    cpu_blocks = [9, 2, 14, 5, 11]
    runner.swap_out(list(zip(table, cpu_blocks, strict=True)))
    pool = runner.kv_cache.device_pool
    pool[:, :, table] = float("nan")  # reused by someone else; any read of them would poison the logits
    new_table = blocks.take(len(table))
    runner.swap_in(list(zip(cpu_blocks, new_table, strict=True)))
    got = decode(runner, cont, 75, new_table)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_copy_blocks_then_diverging_continuations(runner, tokens):
    blocks = Blocks()
    prefix = tokens[:40]  # 2.5 blocks: the third is shared and partly filled
    tail_a, tail_b = tokens[100:110], tokens[200:213]
    table_a = blocks.take(blocks_for(53))
    prefill(runner, prefix, table_a)
    table_b = table_a[:2] + blocks.take(blocks_for(53) - 2)  # fork: share full blocks, copy the partial one
    runner.copy_blocks([(table_a[2], table_b[2])])
    got = runner.execute([ChunkInput(tail_a, 40, table_a, True), ChunkInput(tail_b, 40, table_b, True)])
    fresh_a = prefill(runner, prefix + tail_a, blocks.take(blocks_for(50)))
    fresh_b = prefill(runner, prefix + tail_b, blocks.take(blocks_for(53)))
    assert_same(got[0], fresh_a)
    assert_same(got[1], fresh_b)
    assert not torch.allclose(got[0], got[1])


def test_lcp_cut_inside_a_block_equals_fresh_computation(runner, tokens):
    blocks = Blocks()
    old = tokens[:60]
    cut = 37  # block 2, offset 5
    new_tail = tokens[150:156]  # the new sequence (43 tokens) is shorter than the old one
    table = blocks.take(blocks_for(60))
    prefill(runner, old, table)
    got = runner.execute([ChunkInput(new_tail, cut, table, True)])[0]
    fresh_table = blocks.take(blocks_for(44))
    fresh = prefill(runner, old[:cut] + new_tail, fresh_table)
    assert_same(got, fresh)
    # stale K/V of the old tokens at positions 43..59 never leak into decoding either
    assert_same(decode(runner, [tokens[7]], 43, table)[0], decode(runner, [tokens[7]], 43, fresh_table)[0])


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([], "at least one chunk"),
        ([ChunkInput([], 0, [0], True)], "empty"),
        ([ChunkInput([1, 2], -1, [0], True)], "negative"),
        ([ChunkInput(list(range(17)), 0, [0], True)], "block table"),
        ([ChunkInput([1], 8192, list(range(600)), True)], "positions"),
        ([ChunkInput([49152], 0, [0], True)], "token id"),
        ([ChunkInput([1, 2], 0, [NUM_BLOCKS], True)], "block id"),
    ],
)
def test_bad_inputs_raise_value_error(runner, chunks, message):
    with pytest.raises(ValueError, match=message):
        runner.execute(chunks)


def test_bad_block_pairs_raise_value_error(runner):
    with pytest.raises(ValueError, match="cpu block id"):
        runner.swap_out([(0, 16)])
    with pytest.raises(ValueError, match="device block id"):
        runner.swap_in([(0, NUM_BLOCKS)])
    with pytest.raises(ValueError, match="source block id"):
        runner.copy_blocks([(-1, 0)])


def test_config_facts(runner):
    cfg = runner.config
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (30, 3, 64, 49152)
    assert cfg.max_position_embeddings == 8192
    assert runner.bytes_per_block == 2 * 30 * BLOCK_SIZE * 3 * 64 * 4
    assert 2 in runner.eos_token_ids


def test_llama_3_1_8b_shape_and_a_small_random_runner():
    from inference_svc.engine.models import random_llama_config

    big = random_llama_config("llama-3.1-8b")
    shape = (big.num_layers, big.hidden_size, big.num_heads, big.num_kv_heads, big.intermediate_size, big.vocab_size)
    assert shape == (32, 4096, 32, 8, 14336, 128256)
    assert big.hf_config.rope_parameters["rope_type"] == "llama3" and not big.tie_word_embeddings

    small = random_llama_config(
        "llama-3.1-8b",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    runner = ModelRunner(small, dtype=torch.bfloat16, block_size=16, num_device_blocks=4, num_cpu_blocks=1)
    assert {p.dtype for p in runner.model.parameters()} == {torch.bfloat16}
    assert runner.kv_cache.device_pool.dtype == torch.bfloat16
    logits = runner.execute([ChunkInput(list(range(40)), 0, [2, 0, 3], True)])
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all()
