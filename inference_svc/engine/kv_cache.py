"""Physical paged KV storage: a device pool and a CPU pool, and the copies between them.

Each pool is one tensor ``[num_layers, 2 (K, V), num_blocks, block_size, kv_heads, head_dim]``:
one layer's K (or V) block is contiguous, and a layer's K (or V) viewed as
``[num_blocks * block_size, kv_heads, head_dim]`` is addressed by slot
``block_id * block_size + offset``. The CPU pool is pinned when the device is CUDA; on a
CPU device the two pools are separate tensors and a swap is a real copy.

Which block belongs to whom is the block manager's business; this module only moves bytes.
Every transfer is batched: one gather and one scatter for a whole list of block pairs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch


def kv_bytes_per_block(config: object, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers (K and V). ``config`` has num_layers/num_kv_heads/head_dim."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * elem


def num_blocks_for_bytes(budget_bytes: int, bytes_per_block: int) -> int:
    """How many whole blocks fit in ``budget_bytes``."""
    if bytes_per_block <= 0:
        raise ValueError("bytes_per_block must be positive")
    return max(0, int(budget_bytes) // bytes_per_block)


def free_device_bytes(device: str | torch.device) -> int:
    """Free memory on ``device`` now: CUDA's free memory, or the host's available memory for CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


class KVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_device_blocks: int,
        num_cpu_blocks: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        if block_size < 1 or num_device_blocks < 1 or num_cpu_blocks < 0:
            raise ValueError("need block_size >= 1, num_device_blocks >= 1, num_cpu_blocks >= 0")
        self.device = torch.device(device)
        self.block_size = block_size
        self.num_device_blocks = num_device_blocks
        self.num_cpu_blocks = num_cpu_blocks
        shape = (num_layers, 2, block_size, num_kv_heads, head_dim)

        def pool(n: int, dev: torch.device, pin: bool) -> torch.Tensor:
            return torch.zeros((*shape[:2], n, *shape[2:]), dtype=dtype, device=dev, pin_memory=pin)

        self.device_pool = pool(num_device_blocks, self.device, False)
        self.cpu_pool = pool(num_cpu_blocks, torch.device("cpu"), self.device.type == "cuda")
        flat = (num_layers, 2, num_device_blocks * block_size, num_kv_heads, head_dim)
        slots = self.device_pool.view(flat)
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [(slots[i, 0], slots[i, 1]) for i in range(num_layers)]

    def _index(self, ids: Sequence[int], limit: int, what: str, device: torch.device) -> torch.Tensor:
        if ids and (min(ids) < 0 or max(ids) >= limit):
            raise ValueError(f"{what} block id out of range [0, {limit}): {list(ids)}")
        return torch.tensor(ids, dtype=torch.long, device=device)

    def _pairs(self, pairs: Sequence[tuple[int, int]], src_limit: int, dst_limit: int, names: tuple[str, str]):
        src = self._index([s for s, _ in pairs], src_limit, names[0], torch.device("cpu"))
        dst = self._index([d for _, d in pairs], dst_limit, names[1], torch.device("cpu"))
        return src, dst

    @torch.inference_mode()
    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy device blocks to CPU blocks: ``[(device_block, cpu_block), ...]``."""
        if not pairs:
            return
        src, dst = self._pairs(pairs, self.num_device_blocks, self.num_cpu_blocks, ("device", "cpu"))
        blocks = self.device_pool.index_select(2, src.to(self.device))
        if self.device.type == "cuda":   # through pinned memory: one DMA copy, then the host pool's scatter
            staging = torch.empty(blocks.shape, dtype=blocks.dtype, pin_memory=True)
            blocks = staging.copy_(blocks)
        else:
            blocks = blocks.cpu()
        self.cpu_pool.index_copy_(2, dst, blocks)

    @torch.inference_mode()
    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy CPU blocks to device blocks: ``[(cpu_block, device_block), ...]``."""
        if not pairs:
            return
        src, dst = self._pairs(pairs, self.num_cpu_blocks, self.num_device_blocks, ("cpu", "device"))
        blocks = self.cpu_pool.index_select(2, src)
        if self.device.type == "cuda":
            blocks = blocks.pin_memory()
        dst = dst.to(self.device)
        self.device_pool.index_copy_(2, dst, blocks.to(self.device, non_blocking=True))

    @torch.inference_mode()
    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy device blocks to device blocks (copy-on-write): ``[(src_block, dst_block), ...]``."""
        if not pairs:
            return
        src, dst = self._pairs(pairs, self.num_device_blocks, self.num_device_blocks, ("source", "destination"))
        blocks = self.device_pool.index_select(2, src.to(self.device))
        self.device_pool.index_copy_(2, dst.to(self.device), blocks)
