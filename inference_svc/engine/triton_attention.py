"""Paged attention as Triton kernels: K/V read in place through the block table, one launch per layer.

The SDPA path (attention.py) gathers each sequence's whole context and builds additive masks on the
host every step, which suits the CPU, where the forward dominates. On a GPU that host work and the
gathers were most of a decode step. Here a step's batch, decodes and prefill chunks mixed, is served
by two launches per layer:

- ``store_kv``: each new token's K and V go to their cache slot (a negative slot is skipped: the
  padded rows of a CUDA graph's batch);
- ``paged_attention``: a program per (query tile, KV head). A tile is up to ``block_q`` query tokens
  of one sequence; its rows are (token, query head of the KV head's group), so grouped-query heads
  share every K/V load and a decode is a tile of one token. Keys are walked ``BLOCK_N`` at a time,
  each key's slot looked up in the block table, with an online softmax in fp32; a query at position
  p sees the keys at positions <= p (causal inside a chunk, everything before it cached). Each
  query's position is read from the batch, so a sequence's queries may sit at gapped positions (a
  blend's recomputed tokens among reused ones), ascending.

Nothing here depends on a context length: lengths and tables are tensors the kernel reads, so a
step at a new length reuses the compiled kernel (no per-shape plan). Compiled variants differ only
in ``block_q`` (decode-only batches use small tiles, batches with prefill chunks large ones), the
head size and the group size.

Without a CUDA device the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, chosen by the
engine package before anything imports Triton), which is how the CPU tests check them against the SDPA path.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# The interpreter computes with NumPy, which has no bf16 matmul: there the dots run in fp32 on the
# bf16 values (the same rounding of p to the cache's type first, as on the device).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

BLOCK_N = 64          # keys per iteration
DECODE_ROWS = 16      # rows (tokens x grouped heads) of a tile in a decode-only batch: tl.dot's least M
PREFILL_ROWS = 128    # rows of a tile in a batch with prefill chunks


def group_pad(num_heads: int, num_kv_heads: int) -> int:
    """Query heads per KV head, rounded up to a power of two (a tile's rows must be one)."""
    return triton.next_power_of_2(num_heads // num_kv_heads)


def tile_tokens(num_heads: int, num_kv_heads: int, *, decode_only: bool) -> int:
    """Query tokens per tile: as many as fill a tile's rows with every grouped head."""
    return max(1, (DECODE_ROWS if decode_only else PREFILL_ROWS) // group_pad(num_heads, num_kv_heads))


def supported(head_dim: int) -> bool:
    """The kernels load a head in one ``tl.arange``: its size must be a power of two, at least 16."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kh, stride_kt, stride_vh, stride_vt, stride_cs, stride_ch,
                     NUM_KV_HEADS: tl.constexpr, KV_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, KV_PAD)[:, None]
        d = tl.arange(0, HEAD_DIM)[None, :]
        ok = h < NUM_KV_HEADS
        k = tl.load(k_ptr + h * stride_kh + t * stride_kt + d, mask=ok)
        v = tl.load(v_ptr + h * stride_vh + t * stride_vt + d, mask=ok)
        tl.store(k_cache_ptr + slot * stride_cs + h * stride_ch + d, k, mask=ok)
        tl.store(v_cache_ptr + slot * stride_cs + h * stride_ch + d, v, mask=ok)


@triton.jit(do_not_specialize=["stride_bt"])   # the table's width changes per step: one variant for all
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_table_ptr, positions_ptr, seq_q_start_ptr, seq_q_len_ptr, tile_seq_ptr, tile_off_ptr,
    scale,
    stride_qh, stride_qt, stride_cs, stride_ch, stride_ot, stride_oh, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, IEEE: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    q_off = tl.load(tile_off_ptr + tile)           # first query of this tile, within its sequence
    q_start = tl.load(seq_q_start_ptr + seq).to(tl.int64)   # its sequence's first row in the packed batch
    q_len = tl.load(seq_q_len_ptr + seq)

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    tok = q_off + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_ok = (tok < q_len) & (rows % GROUP_PAD < GROUP)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + head[:, None] * stride_qh + (q_start + tok)[:, None] * stride_qt + d[None, :],
                mask=row_ok[:, None], other=0.0)
    pos = tl.load(positions_ptr + q_start + tok, mask=row_ok, other=0)   # each row sees keys at <= pos

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM], tl.float32)
    last = tl.maximum(tl.minimum(q_off + BLOCK_Q, q_len) - 1, 0)   # the tile's last query token (ascending)
    num_keys = tl.where(q_len > q_off, tl.load(positions_ptr + q_start + last) + 1, 0)
    for n0 in range(0, num_keys, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        key_ok = n < num_keys
        page = tl.load(block_table_ptr + seq * stride_bt + n // PAGE, mask=key_ok, other=0)
        slot = page.to(tl.int64) * PAGE + n % PAGE
        kv_off = slot[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=key_ok[:, None], other=0.0)
        if IEEE:   # fp32 (no TF32: the exactness tests compare against fp32 references), or the interpreter
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
        else:
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        s = tl.where((n[None, :] <= pos[:, None]) & key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows that saw no key yet (padding)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off, mask=key_ok[:, None], other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32),
                                                input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def compiled_variants() -> int:
    """How many variants of the kernels Triton has compiled in this process (a new length must add none)."""
    total = 0
    for kernel in (_store_kv_kernel, _paged_attention_kernel):
        for entry in getattr(kernel, "device_caches", {}).values():
            total += len(entry[0]) if isinstance(entry, tuple) else len(entry)
    return total


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Write ``k``/``v`` ``[kv_heads, T, D]`` (the last axis dense) to cache slots ``[T]`` (< 0: skipped)."""
    kv_heads, t, head_dim = k.shape
    _store_kv_kernel[(t,)](k, v, k_cache, v_cache, slots, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                           k_cache.stride(0), k_cache.stride(1), NUM_KV_HEADS=kv_heads,
                           KV_PAD=triton.next_power_of_2(kv_heads), HEAD_DIM=head_dim)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, *,
                    block_tables: torch.Tensor, positions: torch.Tensor, seq_q_start: torch.Tensor,
                    seq_q_len: torch.Tensor, tile_seq: torch.Tensor, tile_off: torch.Tensor,
                    block_q: int, page_size: int) -> torch.Tensor:
    """Attend ``q`` ``[heads, T, D]`` over the paged cache into ``out`` ``[T, heads, D]``.

    Sequence ``i`` owns rows ``[seq_q_start[i], + seq_q_len[i])`` at ``positions`` (ascending within
    it), and its cached K/V through ``block_tables[i]``; tile ``j`` covers queries
    ``[tile_off[j], + block_q)`` of sequence ``tile_seq[j]``. ``k_cache``/``v_cache`` are
    ``[slots, kv_heads, D]`` and already hold the new tokens' K/V.
    """
    num_heads, _, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    grid = (tile_seq.shape[0], num_kv_heads)
    rows = block_q * group_pad(num_heads, num_kv_heads)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, positions, seq_q_start, seq_q_len, tile_seq, tile_off,
        head_dim ** -0.5,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0),
        GROUP=num_heads // num_kv_heads, GROUP_PAD=group_pad(num_heads, num_kv_heads), BLOCK_Q=block_q,
        BLOCK_N=BLOCK_N, HEAD_DIM=head_dim, PAGE=page_size, IEEE=q.dtype == torch.float32 or INTERPRETED,
        num_warps=8 if rows >= PREFILL_ROWS else 4,   # a 128-row tile's fp32 accumulator needs 8 warps' registers
    )
    return out
