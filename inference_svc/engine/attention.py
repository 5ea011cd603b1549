"""Paged attention over packed batches.

A step packs the new tokens of several sequences into one ``[T, heads, head_dim]`` tensor:
first the single-token rows (decodes), then the multi-token chunks (prefills), each chunk
contiguous. ``AttentionMetadata`` is built once per step and shared by every layer:

- ``slot_mapping[t]`` is where token ``t``'s K/V goes in the flattened cache
  (``slot = block_id * block_size + offset``);
- decodes are attended in one batched SDPA call: their cached K/V are gathered into a
  ``[B, max_ctx]`` tensor with a key-padding mask (padding repeats a valid slot of the
  same sequence so no garbage ever enters the softmax, even masked);
- each prefill chunk is attended on its own: a chunk at ``start_pos == 0`` uses its fresh
  K/V with ``is_causal=True``; a chunk at ``start_pos > 0`` gathers positions
  ``[0, start_pos + len)`` from the cache with a causal mask shifted by ``start_pos``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PrefillChunk:
    """One multi-token chunk: rows ``[row, row + length)`` of the packed batch."""

    row: int
    length: int
    start_pos: int
    kv_slots: torch.Tensor | None  # [start_pos + length] cache slots; None when start_pos == 0
    mask: torch.Tensor | None  # [length, start_pos + length] additive (0 / -inf); None when start_pos == 0


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long
    num_decodes: int  # rows [0, num_decodes) are single-token sequences
    decode_slots: torch.Tensor | None  # [B, max_ctx] long
    decode_mask: torch.Tensor | None  # [B, 1, 1, max_ctx] additive (0 / -inf)
    prefills: tuple[PrefillChunk, ...]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor:
        """The SDPA path (``paged_attention``); the Triton path's metadata has the same method (paged_batch)."""
        return paged_attention(q, k, v, k_cache, v_cache, self)


def _slots(table: torch.Tensor, end: int, block_size: int) -> torch.Tensor:
    """Cache slots of positions ``[0, end)`` for block table(s) ``[..., num_blocks]``."""
    offsets = torch.arange(block_size)
    return (table[..., None] * block_size + offsets).flatten(-2)[..., :end]


def _additive(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A bool "may attend" mask as SDPA's additive float mask (converted once per step, not per layer)."""
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    return mask.to(device)


def build_metadata(
    spans: Sequence[tuple[int, int, Sequence[int]]],
    block_size: int,
    device: torch.device,
    dtype: torch.dtype,
) -> AttentionMetadata:
    """Metadata for sequences ``(start_pos, num_new_tokens, block_table)`` in packed order.

    Single-token spans must all come first (the runner orders them so). Index arithmetic
    is done with tensor ops per sequence, never per token. ``dtype`` is the activations'.
    """
    num_decodes = next((i for i, (_, length, _) in enumerate(spans) if length != 1), len(spans))
    decodes = spans[:num_decodes]
    if any(length == 1 for _, length, _ in spans[num_decodes:]):
        raise ValueError("single-token spans must precede multi-token spans")
    new_slots: list[torch.Tensor] = []

    decode_slots = decode_mask = None
    if decodes:
        ends = [start + 1 for start, _, _ in decodes]
        num_blocks = [-(-end // block_size) for end in ends]
        width = max(num_blocks)
        tables = torch.tensor(
            [list(t[:n]) + [t[0]] * (width - n) for (_, _, t), n in zip(decodes, num_blocks, strict=True)],
            dtype=torch.long,
        )
        max_ctx = max(ends)
        slots = _slots(tables, max_ctx, block_size)  # [B, max_ctx]
        ends_t = torch.tensor(ends)
        valid = torch.arange(max_ctx)[None, :] < ends_t[:, None]
        decode_slots = torch.where(valid, slots, slots[:, :1]).to(device)  # pad with a valid slot
        decode_mask = _additive(valid[:, None, None, :], dtype, device)
        new_slots.append(slots.gather(1, (ends_t - 1)[:, None]).view(-1))

    prefills: list[PrefillChunk] = []
    row = num_decodes
    for start, length, table in spans[num_decodes:]:
        end = start + length
        all_slots = _slots(torch.tensor(table[: -(-end // block_size)], dtype=torch.long), end, block_size)
        new_slots.append(all_slots[start:])
        if start == 0:
            prefills.append(PrefillChunk(row, length, 0, None, None))
        else:
            allowed = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
            prefills.append(PrefillChunk(row, length, start, all_slots.to(device), _additive(allowed, dtype, device)))
        row += length

    return AttentionMetadata(
        slot_mapping=torch.cat(new_slots).to(device),
        num_decodes=num_decodes,
        decode_slots=decode_slots,
        decode_mask=decode_mask,
        prefills=tuple(prefills),
    )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """Store the new ``k``/``v`` in the cache and attend ``q``; returns ``[T, heads * D]``.

    ``q`` is ``[heads, T, D]``, ``k``/``v`` are ``[kv_heads, T, D]`` (head-major: each head's
    rows are dense, which SDPA's CPU kernel reads fastest). ``k_cache``/``v_cache`` are one
    layer's flattened slots ``[num_slots, kv_heads, D]``.
    """
    k_cache.index_copy_(0, meta.slot_mapping, k.transpose(0, 1))
    v_cache.index_copy_(0, meta.slot_mapping, v.transpose(0, 1))
    num_heads, t, head_dim = q.shape
    num_kv_heads = k.shape[0]
    out = q.new_empty(t, num_heads, head_dim)

    b = meta.num_decodes
    if b:
        # One query per sequence: fold the query heads of each KV head into the query-length
        # axis ([B, kv_heads, group, D]) so SDPA needs no GQA support and no repeat of K/V.
        s = meta.decode_slots.shape[1]
        idx = meta.decode_slots.view(-1)
        kd = k_cache.index_select(0, idx).view(b, s, num_kv_heads, head_dim).transpose(1, 2)
        vd = v_cache.index_select(0, idx).view(b, s, num_kv_heads, head_dim).transpose(1, 2)
        qd = q[:, :b].transpose(0, 1).reshape(b, num_kv_heads, num_heads // num_kv_heads, head_dim)
        od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask)
        out[:b] = od.reshape(b, num_heads, head_dim)

    group = num_heads // num_kv_heads
    for p in meta.prefills:
        rows = slice(p.row, p.row + p.length)
        gqa = group > 1
        if p.kv_slots is None:
            kp, vp = k[:, rows], v[:, rows]
        else:
            kp = k_cache.index_select(0, p.kv_slots).transpose(0, 1)
            vp = v_cache.index_select(0, p.kv_slots).transpose(0, 1)
            if gqa and q.device.type == "cuda":  # CUDA's masked kernel lacks GQA: repeat K/V, not math fallback
                kp, vp, gqa = kp.repeat_interleave(group, 0), vp.repeat_interleave(group, 0), False
        op = F.scaled_dot_product_attention(
            q[None, :, rows], kp[None], vp[None], attn_mask=p.mask, is_causal=p.mask is None, enable_gqa=gqa
        )
        out[rows] = op[0].transpose(0, 1)
    return out.view(t, num_heads * head_dim)


def attend_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx_slots: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
    """Attend a sequence's query rows (any subset of its positions, a blend's recomputed tokens) over its
    cached K/V; returns ``[rows, heads * D]``.

    ``q`` is ``[heads, rows, D]`` at ``positions`` ``[rows]``; ``ctx_slots`` are the cache slots of positions
    ``[0, end)``; row ``i`` sees positions ``<= positions[i]``.
    """
    num_heads, rows, head_dim = q.shape
    end = ctx_slots.shape[0]
    kp = k_cache.index_select(0, ctx_slots).transpose(0, 1)
    vp = v_cache.index_select(0, ctx_slots).transpose(0, 1)
    gqa = num_heads != kp.shape[0]
    if gqa and q.device.type == "cuda":   # CUDA's masked kernel lacks GQA: repeat K/V
        group = num_heads // kp.shape[0]
        kp, vp, gqa = kp.repeat_interleave(group, 0), vp.repeat_interleave(group, 0), False
    allowed = torch.arange(end, device=positions.device)[None, :] <= positions[:, None]
    mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed.to(q.device),
                                                                                  float("-inf"))
    out = F.scaled_dot_product_attention(q[None], kp[None], vp[None], attn_mask=mask, enable_gqa=gqa)
    return out[0].transpose(0, 1).reshape(rows, num_heads * head_dim)
