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
  ``[0, start_pos + len)`` from the cache with a causal mask shifted by ``start_pos``; a span of
  rows at gapped positions (a blend's) likewise, each row seeing the positions up to its own.

``SdpaAttention`` is the CPU's ``BatchAttention`` (batch_attention.py) over these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inference_svc.engine.batch_attention import Batch, ChunkInput, Span, span_of


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
        return paged_attention(q, k, v, k_cache, v_cache, self)


def _slots(table: torch.Tensor, end: int, block_size: int) -> torch.Tensor:
    """Cache slots of positions ``[0, end)`` for block table(s) ``[..., num_blocks]``."""
    offsets = torch.arange(block_size)
    return (table[..., None] * block_size + offsets).flatten(-2)[..., :end]


def _additive(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A bool "may attend" mask as SDPA's additive float mask (converted once per step, not per layer)."""
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    return mask.to(device)


def _is_decode(span: Span) -> bool:
    return span.contiguous and len(span.token_ids) == 1


def build_metadata(spans: Sequence[Span], block_size: int, device: torch.device,
                   dtype: torch.dtype) -> AttentionMetadata:
    """Metadata for ``spans`` in packed order (their token ids are not read).

    Single-token spans at contiguous positions (decodes) must all come first (``SdpaAttention``
    orders them so). Index arithmetic is done with tensor ops per sequence, never per token.
    ``dtype`` is the activations'.
    """
    num_decodes = next((i for i, s in enumerate(spans) if not _is_decode(s)), len(spans))
    decodes = spans[:num_decodes]
    if any(_is_decode(s) for s in spans[num_decodes:]):
        raise ValueError("single-token spans must precede multi-token spans")
    new_slots: list[torch.Tensor] = []

    decode_slots = decode_mask = None
    if decodes:
        ends = [s.start + 1 for s in decodes]
        num_blocks = [-(-end // block_size) for end in ends]
        width = max(num_blocks)
        tables = torch.tensor(
            [list(s.block_table[:n]) + [s.block_table[0]] * (width - n)
             for s, n in zip(decodes, num_blocks, strict=True)],
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
    for s in spans[num_decodes:]:
        length, end = len(s.token_ids), s.end
        all_slots = _slots(torch.tensor(s.block_table[: -(-end // block_size)], dtype=torch.long), end, block_size)
        if s.contiguous and s.start == 0:
            new_slots.append(all_slots)
            prefills.append(PrefillChunk(row, length, 0, None, None))
        else:   # over cached positions: each row sees the positions up to its own
            positions = torch.arange(s.start, end) if s.contiguous else torch.tensor(s.positions)
            new_slots.append(all_slots[positions])
            allowed = torch.arange(end)[None, :] <= positions[:, None]
            prefills.append(PrefillChunk(row, length, int(positions[0]), all_slots.to(device),
                                         _additive(allowed, dtype, device)))
        row += length

    return AttentionMetadata(
        slot_mapping=torch.cat(new_slots).to(device),
        num_decodes=num_decodes,
        decode_slots=decode_slots,
        decode_mask=decode_mask,
        prefills=tuple(prefills),
    )


class SdpaAttention:
    """The CPU's ``BatchAttention``: a step's metadata built on the host, SDPA calls per layer (``paged_attention``)."""

    def __init__(self, *, block_size: int, device: torch.device, dtype: torch.dtype) -> None:
        self.block_size, self.device, self.dtype = block_size, device, dtype
        self.meta: AttentionMetadata | None = None

    def prepare(self, chunks: Sequence[ChunkInput]) -> Batch:
        return self.pack([span_of(c) for c in chunks])

    def pack(self, spans: Sequence[Span]) -> Batch:
        """Decodes first (attention batches them in one call), the other spans after them in their order."""
        order = sorted(range(len(spans)), key=lambda i: not _is_decode(spans[i]))
        ids: list[int] = []
        starts = [0] * len(spans)
        positions = []
        for i in order:
            s = spans[i]
            starts[i] = len(ids)
            ids.extend(s.token_ids)
            positions.append(torch.arange(s.start, s.start + len(s.token_ids)) if s.contiguous
                             else torch.tensor(s.positions))
        rows = [starts[i] + len(s.token_ids) - s.num_logits + j
                for i, s in enumerate(spans) for j in range(s.num_logits)]
        self.meta = build_metadata([spans[i] for i in order], self.block_size, self.device, self.dtype)
        return Batch(torch.tensor(ids, dtype=torch.long).to(self.device), torch.cat(positions).to(self.device),
                     torch.tensor(rows, dtype=torch.long, device=self.device), self, tuple(starts))

    def narrow(self, layer: int, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor | None:
        return None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor:
        return paged_attention(q, k, v, k_cache, v_cache, self.meta)


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
