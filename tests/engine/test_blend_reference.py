"""Blend through every attention implementation against the recorded outputs of the gather-based blend
forward (blend_scenario.py, fp32, the real model): a step mixing a decode, a plain chunk and two blended
chunks gives the same logits and KV, and greedy decodes over the blended KV the same tokens. The
Triton kernels run in Triton's interpreter on a CPU."""

from __future__ import annotations

import json

import pytest
import torch

from inference_svc.engine.blend import rotate_keys, token_slots
from inference_svc.engine.chunk_store import ChunkReuse, ReusedSpan
from inference_svc.engine.model_runner import ChunkInput
from tests.engine import blend_scenario


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(blend_scenario.REFERENCE.read_text())


@pytest.fixture(scope="module")
def encode(embedded_model_dir):
    return blend_scenario.encoder(embedded_model_dir)


@pytest.fixture(scope="module")
def sdpa_runner(embedded_model_dir):
    return blend_scenario.runner(embedded_model_dir, "sdpa")


def assert_matches(got: dict, want: dict) -> None:
    assert got["tokens"] == {name: tokens[:len(got["tokens"][name])] for name, tokens in want["tokens"].items()}
    for row_got, row_want in zip(got["logits"], want["logits"], strict=True):
        assert row_got["ids"][0] == row_want["ids"][0]                       # the same greedy token
        torch.testing.assert_close(torch.tensor(row_got["values"]), torch.tensor(row_want["values"]),
                                   atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(got["kv"]), torch.tensor(want["kv"]), atol=5e-2, rtol=1e-4)


@pytest.mark.parametrize("fraction", blend_scenario.FRACTIONS)
def test_sdpa_blend_equals_the_recorded_outputs(sdpa_runner, encode, reference, fraction):
    assert_matches(blend_scenario.run(sdpa_runner, encode, fraction), reference[str(fraction)])


@pytest.mark.slow   # a minute in Triton's interpreter (the SDPA path runs in the default suite)
def test_kernels_blend_equals_the_recorded_outputs(embedded_model_dir, sdpa_runner, encode, reference):
    """In the interpreter, kept short: the first step (no blend in it) is SDPA's, and two decodes follow."""
    pytest.importorskip("triton")
    runner = blend_scenario.runner(embedded_model_dir, "triton")
    fraction = blend_scenario.FRACTIONS[1]            # a share that recomputes some reused tokens, not all
    got = blend_scenario.run(runner, encode, fraction, filled_by=sdpa_runner, decodes=2)
    assert_matches(got, reference[str(fraction)])


def test_a_chunk_of_reused_tokens_only_is_loaded_and_computes_no_row(sdpa_runner, encode):
    """Recompute share 0, no logits wanted: the chunk's KV is the cached passage's, re-rotated, and the
    step beside it (a decode) gives the logits it gives alone."""
    runner, bs = sdpa_runner, blend_scenario.BLOCK
    head, doc = encode(blend_scenario.HEAD_A), encode(blend_scenario.DOCS[0])
    cached, moved = list(range(0, 8)), list(range(8, 16))
    runner.execute([ChunkInput(head + doc, 0, cached, False), ChunkInput(doc[:3], 0, moved, False)])
    alone = runner.execute([ChunkInput([42], len(head) + len(doc), cached, True)])
    span = ReusedSpan(3, len(doc) - 3, tuple(cached), False, len(head) + 3, 0)
    reuse = ChunkReuse((span,), (), 0.0)
    both = runner.execute([ChunkInput(doc[3:], 3, moved, False, reuse=reuse),
                           ChunkInput([42], len(head) + len(doc), cached, True)])
    torch.testing.assert_close(both, alone, atol=1e-4, rtol=1e-4)
    keys = runner.kv_cache.layers[5][0]
    got = keys[token_slots(moved, 3, len(doc) - 3, bs)]
    want = rotate_keys(keys[token_slots(cached, len(head) + 3, len(doc) - 3, bs)], -len(head),
                       runner.model.rotary.inv_freq)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
