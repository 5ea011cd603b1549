"""Blending: reuse a cached passage's KV at a new position, recomputing the tokens that deviate most.

CacheBlend's way (EuroSys'25; LMCache's blender), on our paged cache:

1. `load_spans`: the cached K/V of each reused span is copied into the request's slots, every layer
   at once, the keys re-rotated to the new positions. RoPE rotations compose, so a key computed at
   position p and rotated by `delta` is the key at p + delta (`rotate_keys`, in fp32).
2. The chunk's forward (`LlamaForCausalLM.forward_blend`) runs every token through the first layers
   up to `CHECK_LAYER`; there it compares each reused token's fresh K/V with the loaded ones and keeps
   on only the `fraction` of reused tokens that deviate most (plus every token that was not reused,
   and the rows that give logits). Later layers compute only those rows; the other tokens keep the
   loaded (cached) KV. Fraction 0 skips the reused tokens altogether: their KV is exactly the cached
   one (re-rotated); fraction 1 recomputes every token, as a fresh prefill does.
3. `store_captures`: after the forward, the KV of passages this step completed is copied into the
   chunk store's blocks (chunk_store.py), for later requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

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
