"""Block tensors in and out of the engine, for KV transfer between replicas (disaggregated prefill).

`export_blocks` reads the KV of a request's tokens [start, end) as whole blocks (the last one may
be partly filled) through the scheduler's block table; `import_blocks` writes shipped blocks into a
request through the scheduler (`Scheduler.import_blocks`: it allocates, the request's prefill is
"filled from transfer"), so the scheduler stays the KV manager's only owner. Both run on the engine
thread, between steps. Bytes travel as raw tensors laid out
``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`` (kv_cache.py's pool layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_svc.engine.request import Request


@dataclass(frozen=True)
class KvLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str            # torch dtype name without "torch.", e.g. "float32"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def block_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)

    def nbytes(self, num_blocks: int) -> int:
        elem = torch.empty((), dtype=self.torch_dtype).element_size()
        n = elem * num_blocks
        for dim in self.block_shape(1):
            n *= dim
        return n


def layout_of(engine) -> KvLayout:
    """This engine's block layout (what a peer must match)."""
    pool = engine.runner.kv_cache.device_pool
    num_layers, _, _, block_size, heads, head_dim = pool.shape
    return KvLayout(num_layers, heads, head_dim, block_size, str(pool.dtype).removeprefix("torch."))


def blocks_for_range(start: int, end: int, block_size: int) -> int:
    """Blocks covering tokens [start, end) with `start` block-aligned."""
    return -(-(end - start) // block_size)


@torch.inference_mode()
def export_blocks(engine, request: Request, start: int, end: int) -> torch.Tensor:
    """The KV of `request`'s tokens [start, end) (start block-aligned, all computed and on the
    device) as a CPU tensor of whole blocks."""
    bs = engine.scheduler.block_size
    if start % bs or not start < end <= request.num_computed_tokens:
        raise ValueError(f"export [{start}, {end}) of {request.request_id!r}: start must be block-aligned "
                         f"and the range computed ({request.num_computed_tokens} tokens)")
    table = engine.scheduler.block_table(request)
    blocks = list(table[start // bs:-(-end // bs)])
    pool = engine.runner.kv_cache.device_pool
    index = torch.tensor(blocks, dtype=torch.long, device=pool.device)
    return pool.index_select(2, index).cpu().contiguous()


@torch.inference_mode()
def import_blocks(engine, request: Request, start: int, end: int, data: torch.Tensor) -> int:
    """Write shipped blocks holding tokens [start, end) into `request` (its tokens already include
    them). Returns how many tokens were imported: `end - start`, or 0 when the scheduler declined
    (the engine computes them itself)."""
    blocks = engine.scheduler.import_blocks(request, start, end)
    if blocks is None:
        return 0
    pool = engine.runner.kv_cache.device_pool
    index = torch.tensor(blocks, dtype=torch.long, device=pool.device)
    pool.index_copy_(2, index, data[:, :, :len(blocks)].to(pool.device, pool.dtype))
    return end - start


def to_bytes(data: torch.Tensor) -> bytes:
    return data.contiguous().view(torch.uint8).numpy().tobytes()


def from_bytes(raw: bytes, layout: KvLayout, num_blocks: int) -> torch.Tensor:
    """The tensor of `num_blocks` blocks in `raw` (ValueError when the size does not match)."""
    if len(raw) != layout.nbytes(num_blocks):
        raise ValueError(f"{num_blocks} blocks take {layout.nbytes(num_blocks)} bytes, got {len(raw)}")
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return flat.view(layout.torch_dtype).view(layout.block_shape(num_blocks))
