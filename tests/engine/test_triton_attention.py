"""The kernels' BatchAttention (the Triton paged-attention kernels) against the SDPA one, on random
paged layouts, and both against attention computed from scratch for rows at gapped positions (a blend's).

On this CPU the kernels run in Triton's interpreter (the engine package sets TRITON_INTERPRET=1 when
there is no CUDA device); on a CUDA machine the same tests run the compiled kernels. Layouts: blocks
shuffled over the pool, grouped-query heads (including a group that is not a power of two), partial
last blocks, decodes mixed with prefill chunks over cached prefixes in one batch, and spans of rows
at gapped positions beside them.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

import torch.nn.functional as F

from inference_svc.engine.attention import SdpaAttention
from inference_svc.engine.batch_attention import Span
from inference_svc.engine.paged_batch import BatchBuilder, KernelAttention, Layout

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK = 16


def _layout(rng: random.Random, lengths: list[tuple[int, int]], num_blocks: int) -> list[tuple[int, int, list[int]]]:
    """(start, new tokens, shuffled block table) per sequence, blocks drawn without reuse from the pool."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    spans = []
    for start, n in lengths:
        need = -(-(start + n) // BLOCK)
        spans.append((start, n, [free.pop() for _ in range(need)]))
    return spans


def _caches(num_blocks: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks * BLOCK, kv_heads, head_dim)
    k = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    v = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    return k.to(DEVICE), v.to(DEVICE)


def _sdpa(dtype=torch.float32) -> SdpaAttention:
    return SdpaAttention(block_size=BLOCK, device=DEVICE, dtype=dtype)


def _kernels(heads: int, kv_heads: int) -> KernelAttention:
    return KernelAttention(block_size=BLOCK, num_heads=heads, num_kv_heads=kv_heads, device=DEVICE)


def _qkv(t, heads, kv_heads, head_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed + 1)
    return tuple(torch.randn(n, t, head_dim, generator=gen).to(dtype).to(DEVICE) for n in (heads, kv_heads, kv_heads))


def _run_both(lengths, heads, kv_heads, head_dim=32, dtype=torch.float32, seed=0):
    rng = random.Random(seed)
    num_blocks = sum(-(-(s + n) // BLOCK) for s, n in lengths) + 5
    spans = _layout(rng, lengths, num_blocks)
    q, k, v = _qkv(sum(n for _, n, _ in spans), heads, kv_heads, head_dim, dtype, seed)

    kc_ref, vc_ref = _caches(num_blocks, kv_heads, head_dim, dtype, seed)
    kc, vc = kc_ref.clone(), vc_ref.clone()
    batch = [Span([0] * n, s, table, 0) for s, n, table in spans]   # decodes first: SDPA keeps the rows in order
    sdpa = _sdpa(dtype)
    sdpa.pack(batch)
    ref = sdpa.attend(q, k, v, kc_ref, vc_ref)

    kernels = _kernels(heads, kv_heads)
    kernels.pack(batch)
    out = kernels.attend(q, k, v, kc, vc)
    return ref, out, (kc_ref, vc_ref), (kc, vc)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 1), (6, 2), (4, 4), (9, 3)])
def test_decodes_and_chunks_mixed_match_sdpa(heads, kv_heads):
    lengths = [(37, 1), (5, 1), (16, 1),          # decodes: partial, short, a full last block
               (0, 23),                           # a first chunk (causal over itself)
               (40, 19), (64, 33)]                # chunks over cached prefixes, partial and aligned starts
    ref, out, caches_ref, caches = _run_both(lengths, heads, kv_heads, seed=heads * 7 + kv_heads)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    for a, b in zip(caches, caches_ref, strict=True):   # the new K/V went to the same slots
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_decode_only_batch_uses_small_tiles_and_matches():
    ref, out, _, _ = _run_both([(70, 1), (3, 1), (129, 1), (0, 1)], heads=8, kv_heads=2, seed=3)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_bf16_within_rounding():
    ref, out, _, _ = _run_both([(20, 1), (17, 30)], heads=4, kv_heads=2, dtype=torch.bfloat16, seed=5)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_padding_rows_of_a_fixed_layout_read_and_write_nothing():
    """A graph's bucket is wider than the step: the padded sequences must not touch the cache or the output."""
    heads, kv_heads, head_dim = 4, 2, 32
    builder = BatchBuilder(block_size=BLOCK, num_heads=heads, num_kv_heads=kv_heads, device=DEVICE)
    kc, vc = _caches(8, kv_heads, head_dim, torch.float32, 0)
    before = kc.clone(), vc.clone()
    spans = [Span([1], 20, [3, 5], 1)]
    layout = Layout(tokens=4, seqs=4, tiles=4, width=6, rows=4)
    host, layout, bq = builder.pack(spans, layout)
    kernels = _kernels(heads, kv_heads)
    kernels.batch(*builder.to_device(host, layout, bq))
    q = torch.randn(heads, 4, head_dim, device=DEVICE)
    k = torch.randn(kv_heads, 4, head_dim, device=DEVICE)
    v = torch.randn(kv_heads, 4, head_dim, device=DEVICE)
    out = kernels.attend(q, k, v, kc, vc)
    changed = (kc != before[0]).any(dim=(1, 2)).nonzero().view(-1).tolist()
    assert changed == [5 * BLOCK + 4]                      # only position 20's slot, in block 5
    assert torch.isfinite(out[0]).all()

    sdpa = _sdpa()
    sdpa.pack(spans)
    kr, vr = before[0].clone(), before[1].clone()
    ref = sdpa.attend(q[:, :1], k[:, :1], v[:, :1], kr, vr)
    torch.testing.assert_close(out[:1], ref, atol=2e-5, rtol=2e-5)


def test_logit_rows_and_layout_fields():
    builder = BatchBuilder(block_size=BLOCK, num_heads=4, num_kv_heads=2, device=torch.device("cpu"))
    spans = [Span([7], 33, [4, 1, 9], 1), Span([1, 2, 3], 0, [2], 2), Span([5, 6], 16, [0, 3], 0)]
    host, layout, _ = builder.pack(spans)
    f = layout.views(host)
    assert f["input_ids"].tolist() == [7, 1, 2, 3, 5, 6]
    assert f["positions"].tolist() == [33, 0, 1, 2, 16, 17]
    assert f["slot_mapping"].tolist() == [9 * BLOCK + 1, 2 * BLOCK, 2 * BLOCK + 1, 2 * BLOCK + 2,
                                          3 * BLOCK, 3 * BLOCK + 1]
    assert f["logit_rows"].tolist() == [0, 2, 3]           # the decode's row, the chunk's last two
    assert f["seq_q_start"].tolist() == [0, 1, 4]
    assert f["block_tables"][0].tolist() == [4, 1, 9]


def _from_scratch(q, kc, vc, spans, rows):
    """Each span's rows attended over its cached K/V up to each row's own position (the cache already
    holds the new K/V), one SDPA call per row: ``[T, heads * D]``."""
    heads, _, head_dim = q.shape
    out = []
    for s, first in zip(spans, rows, strict=True):
        table = torch.tensor(s.block_table)
        positions = s.positions if s.positions is not None else range(s.start, s.start + len(s.token_ids))
        for j, p in enumerate(positions):
            slots = table[torch.arange(p + 1) // BLOCK] * BLOCK + torch.arange(p + 1) % BLOCK
            keys, values = kc[slots.to(DEVICE)].transpose(0, 1), vc[slots.to(DEVICE)].transpose(0, 1)
            group = heads // keys.shape[0]
            o = F.scaled_dot_product_attention(q[:, first + j:first + j + 1], keys.repeat_interleave(group, 0),
                                               values.repeat_interleave(group, 0))
            out.append(o.transpose(0, 1).reshape(1, heads * head_dim))
    return torch.cat(out)


@pytest.mark.parametrize("implementation", ["sdpa", "kernels"])
def test_rows_at_gapped_positions_match_attention_from_scratch(implementation):
    """A blend's rows (gapped positions, runs of one and of several, a run from position 0) beside a
    decode and a plain chunk: each row sees every cached position up to its own."""
    heads, kv_heads, head_dim = 6, 2, 32
    num_blocks = 24
    free = list(range(num_blocks))
    random.Random(4).shuffle(free)
    spans = [Span([0], 40, free[0:3], 1),
             Span([0] * 7, 0, free[3:9], 2, positions=[0, 1, 2, 17, 30, 31, 80]),
             Span([0] * 20, 33, free[9:13], 1),
             Span([0] * 3, 50, free[13:17], 0, positions=[50, 52, 60])]
    t = sum(len(s.token_ids) for s in spans)
    q, k, v = _qkv(t, heads, kv_heads, head_dim, torch.float32, 9)
    kc, vc = _caches(num_blocks, kv_heads, head_dim, torch.float32, 9)
    attention = _sdpa() if implementation == "sdpa" else _kernels(heads, kv_heads)
    batch = attention.pack(spans)
    out = attention.attend(q, k, v, kc, vc)
    assert batch.logit_rows.tolist() == [batch.starts[0], batch.starts[1] + 5, batch.starts[1] + 6,
                                         batch.starts[2] + 19]
    # the rows are packed in the order of batch.starts; the reference reads the same rows
    order = sorted(range(len(spans)), key=batch.starts.__getitem__)
    ref = _from_scratch(q, kc, vc, [spans[i] for i in order], [batch.starts[i] for i in order])
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
