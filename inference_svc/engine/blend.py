"""Blending: reuse a cached passage's KV at a new position, recomputing the tokens that deviate most.

CacheBlend's way (EuroSys'25; LMCache's blender), on our paged cache:

1. `load_spans`: the cached K/V of each reused span is copied into the request's slots, every layer
   at once, the keys re-rotated to the new positions. RoPE rotations compose, so a key computed at
   position p and rotated by `delta` is the key at p + delta (`rotate_keys`, in fp32).
2. The step's one forward (`BlendAttention`, a `BatchAttention` over the runner's SDPA or kernels)
   runs every token of a blended chunk through the first layers up to `CHECK_LAYER`; there `narrow`
   compares each reused token's fresh K/V with the loaded ones and keeps on only the `fraction` of
   reused tokens that deviate most (plus every token that was not reused, and the rows that give
   logits). Later layers compute only those rows, packed again as rows at gapped positions; the other
   tokens keep the loaded (cached) KV. Fraction 0 skips the reused tokens altogether: their KV is
   exactly the cached one (re-rotated); fraction 1 recomputes every token, as a fresh prefill does.
   The step's other chunks go through the same forward unchanged.
3. `store_captures`: after the forward, the KV of passages this step completed is copied into the
   chunk store's blocks (chunk_store.py), for later requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from inference_svc.engine.batch_attention import Batch, ChunkInput, PackedAttention, Span, span_of
from inference_svc.engine.chunk_store import Capture, ReusedSpan

CHECK_LAYER = 1        # the layer whose K/V deviation picks the tokens to recompute (LMCache's default)


def rotate_keys(keys: torch.Tensor, delta: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys ``[..., n, heads, head_dim]`` rotated by ``delta`` positions (Hugging Face's rotate_half
    layout), computed in fp32 and returned in the keys' dtype."""
    freqs = float(delta) * inv_freq.float()
    emb = torch.cat((freqs, freqs))
    cos, sin = emb.cos(), emb.sin()
    k = keys.float()
    k1, k2 = k.chunk(2, dim=-1)
    return (k * cos + torch.cat((-k2, k1), dim=-1) * sin).to(keys.dtype)


def token_slots(blocks: Sequence[int], first: int, length: int, block_size: int) -> torch.Tensor:
    """Cache slots of tokens ``[first, first + length)`` of a block list (slot = block * size + offset)."""
    positions = torch.arange(first, first + length)
    table = torch.tensor(list(blocks), dtype=torch.long)
    return table[positions // block_size] * block_size + positions % block_size


def _flat(pool: torch.Tensor) -> torch.Tensor:
    layers, two, blocks, block_size = pool.shape[:4]
    return pool.view(layers, two, blocks * block_size, *pool.shape[4:])


@torch.inference_mode()
def load_spans(device_pool: torch.Tensor, cpu_pool: torch.Tensor, spans: Sequence[ReusedSpan],
               block_table: Sequence[int], block_size: int, inv_freq: torch.Tensor) -> None:
    """Copy each span's cached K/V (all layers) into the request's slots, keys rotated by the span's delta."""
    device = _flat(device_pool)
    for span in spans:
        source = _flat(cpu_pool) if span.on_cpu else device
        src = token_slots(span.blocks, span.offset, span.length, block_size)
        dst = token_slots(block_table, span.start, span.length, block_size)
        kv = source.index_select(2, src.to(source.device)).to(device.device)   # [layers, 2, n, heads, dim]
        if span.delta:
            kv[:, 0] = rotate_keys(kv[:, 0], span.delta, inv_freq)
        device.index_copy_(2, dst.to(device.device), kv)


@torch.inference_mode()
def store_captures(device_pool: torch.Tensor, captures: Sequence[Capture], block_table: Sequence[int],
                   block_size: int) -> None:
    """Copy the K/V (all layers) of each captured passage from the request's slots into its entry's blocks."""
    device = _flat(device_pool)
    for capture in captures:
        src = token_slots(block_table, capture.start, capture.length, block_size).to(device.device)
        dst = token_slots(capture.blocks, 0, capture.length, block_size).to(device.device)
        device.index_copy_(2, dst, device.index_select(2, src))


def select_rows(deviation: torch.Tensor, must: torch.Tensor, num_recompute: int) -> torch.Tensor:
    """Indices (ascending) of the rows that go on: every `must` row and the `num_recompute` others with the
    largest `deviation`."""
    score = deviation.float().masked_fill(must, float("inf"))
    keep = int(must.sum()) + min(num_recompute, int((~must).sum()))
    return torch.topk(score, keep).indices.sort().values


@dataclass(frozen=True)
class _Blended:
    """A blended chunk's rows in the batch: which must go on, how many others may, and their cache slots."""

    must: torch.Tensor          # [rows] bool: not reused, or giving logits
    num_recompute: int
    slots: torch.Tensor         # [rows] cache slots, on the device


class BlendAttention:
    """Chunks that reuse cached passages, in the same forward as the rest of the step, through ``base``
    (the runner's SDPA or kernels); a step with no such chunk is the base's own."""

    def __init__(self, base: PackedAttention, *, device_pool: torch.Tensor, cpu_pool: torch.Tensor,
                 block_size: int, inv_freq: torch.Tensor, num_layers: int) -> None:
        self.base = base
        self.device_pool, self.cpu_pool = device_pool, cpu_pool
        self.block_size, self.inv_freq = block_size, inv_freq
        self.check = min(CHECK_LAYER, num_layers - 1)
        self._spans: list[Span] = []
        self._blended: dict[int, _Blended] = {}
        self._starts: tuple[int, ...] = ()

    def prepare(self, chunks: Sequence[ChunkInput]) -> Batch:
        if not any(c.reuse is not None and c.reuse.spans for c in chunks):
            return self.base.prepare(chunks)
        spans, blended = [span_of(c) for c in chunks], {}
        for i, c in enumerate(chunks):
            if c.reuse is None or not c.reuse.spans:
                continue
            load_spans(self.device_pool, self.cpu_pool, c.reuse.spans, c.block_table, self.block_size, self.inv_freq)
            n = len(c.token_ids)
            must = torch.ones(n, dtype=torch.bool)
            for span in c.reuse.spans:
                must[span.start - c.start_pos:span.start - c.start_pos + span.length] = False
            must[n - spans[i].num_logits:] = True
            num_recompute = c.reuse.recomputed_tokens
            rows = torch.arange(n) if num_recompute else must.nonzero().view(-1)   # 0: reused rows skipped
            positions = (rows + c.start_pos).tolist()
            spans[i] = Span([c.token_ids[r] for r in rows.tolist()], c.start_pos, c.block_table,
                            spans[i].num_logits, positions)
            slots = token_slots(c.block_table, c.start_pos, n, self.block_size)[rows]
            blended[i] = _Blended(must[rows], num_recompute, slots.to(self.device_pool.device))
        live = [i for i, s in enumerate(spans) if s.token_ids]   # a chunk of reused rows only: loaded, no rows
        spans, blended = [spans[i] for i in live], {j: blended[i] for j, i in enumerate(live) if i in blended}
        if not spans:
            device = self.device_pool.device
            self._spans = []
            return Batch(torch.empty(0, dtype=torch.long, device=device), torch.empty(0, dtype=torch.long,
                         device=device), torch.empty(0, dtype=torch.long, device=device), self)
        batch = self.base.pack(spans)
        self._spans, self._blended, self._starts = spans, blended, batch.starts
        # Rows of the last layer: a blended chunk keeps its `must` rows and up to `num_recompute` others.
        kept = {i: int(b.must.sum()) + min(b.num_recompute, int((~b.must).sum())) for i, b in blended.items()}
        order = sorted(range(len(spans)), key=batch.starts.__getitem__)
        final, row = [0] * len(spans), 0
        for i in order:
            final[i] = row
            row += kept.get(i, len(spans[i].token_ids))
        ends = [final[i] + kept.get(i, len(s.token_ids)) for i, s in enumerate(spans)]
        logit_rows = [ends[i] - s.num_logits + j for i, s in enumerate(spans) for j in range(s.num_logits)]
        return Batch(batch.input_ids, batch.positions,
                     torch.tensor(logit_rows, dtype=torch.long, device=batch.input_ids.device), self, batch.starts)

    def narrow(self, layer: int, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor | None:
        """At the check layer: each blended chunk's rows that go on (the ones that must, and the reused
        rows whose fresh K/V deviate most from the loaded); the base attends those from then on."""
        if layer != self.check or not self._spans:
            return None
        spans, keep, narrowed = list(self._spans), [], False
        for i in sorted(range(len(spans)), key=self._starts.__getitem__):
            start, n = self._starts[i], len(spans[i].token_ids)
            rows = torch.arange(start, start + n, device=k.device)
            b = self._blended.get(i)
            if b is not None and b.num_recompute and n > int(b.must.sum()):
                fresh = slice(start, start + n)
                deviation = ((k[:, fresh].transpose(0, 1).float() - k_cache.index_select(0, b.slots).float()) ** 2
                             ).sum((1, 2))
                deviation += ((v[:, fresh].transpose(0, 1).float() - v_cache.index_select(0, b.slots).float()) ** 2
                              ).sum((1, 2))
                sub = select_rows(deviation, b.must.to(k.device), b.num_recompute)
                rows, chosen = rows[sub], sub.tolist()
                s = spans[i]
                spans[i] = replace(s, token_ids=[s.token_ids[r] for r in chosen],
                                   positions=[s.positions[r] for r in chosen])
                narrowed = True
            keep.append(rows)
        if not narrowed:
            return None
        self.base.pack(spans)
        return torch.cat(keep)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor:
        if not self._spans:
            return q.new_empty(0, q.shape[0] * q.shape[2])
        return self.base.attend(q, k, v, k_cache, v_cache)
