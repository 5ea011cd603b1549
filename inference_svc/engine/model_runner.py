"""Tensors in, logits out: one forward pass over packed chunks of several sequences.

A step mixes prefill chunks of some requests with decode tokens of others. The runner
packs all their new tokens into one batch (linear layers run over the concatenation),
writes their K/V into the paged cache, attends each sequence over its own blocks, and
computes the LM head only for the chunks that want next-token logits.

Which blocks a sequence owns, and what to swap or copy, is decided elsewhere (block
manager, scheduler); the runner owns the weights, the KV tensors and the math.

How a step is packed and attended is one ``BatchAttention`` (batch_attention.py), chosen here once:
the Triton kernels on CUDA (paged_batch.py, with CUDA graphs of decode steps) or SDPA (attention.py),
under blend (blend.py), which runs the chunks that reuse cached passages (blend mode, chunk_store.py)
through the same forward; the passages a chunk completes are captured after the forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from inference_svc.engine.attention import SdpaAttention
from inference_svc.engine.batch_attention import Batch, ChunkInput, Graphs, NoGraphs, PackedAttention
from inference_svc.engine.blend import BlendAttention, store_captures
from inference_svc.engine.kv_cache import KVCache, kv_bytes_per_block
from inference_svc.engine.models import ModelConfig, load_model, random_model
from inference_svc.engine.options import ATTENTION_CHOICES

__all__ = ["ChunkInput", "ModelRunner", "resolve_attention"]


def resolve_attention(choice: str, device: torch.device, head_dim: int) -> str:
    """"auto": the Triton kernels on CUDA (when the head size suits them), SDPA on the CPU."""
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got {choice!r}")
    if choice != "auto":
        return choice
    if device.type != "cuda":
        return "sdpa"
    from inference_svc.engine.triton_attention import supported

    return "triton" if supported(head_dim) else "sdpa"


class ModelRunner:
    """A Llama-family model plus its paged KV cache on ``device``.

    ``model`` is a Hugging Face directory (real weights) or a ``ModelConfig`` (random
    weights drawn on the device, for benchmarks: see ``random_llama_config``).
    """

    def __init__(
        self,
        model: str | Path | ModelConfig,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        block_size: int = 16,
        num_device_blocks: int,
        num_cpu_blocks: int,
        seed: int = 0,
        attention: str = "auto",
        cuda_graphs: bool = True,
    ) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        self.block_size = block_size
        if isinstance(model, ModelConfig):
            self.model = random_model(model, self.device, dtype, seed=seed)
        else:
            self.model = load_model(model, self.device, dtype)
        self.config: ModelConfig = self.model.config
        self.kv_cache = KVCache(
            num_layers=self.config.num_layers,
            num_kv_heads=self.config.num_kv_heads,
            head_dim=self.config.head_dim,
            block_size=block_size,
            num_device_blocks=num_device_blocks,
            num_cpu_blocks=num_cpu_blocks,
            dtype=dtype,
            device=self.device,
        )
        self.bytes_per_block = kv_bytes_per_block(self.config, block_size, dtype)
        self.attention = resolve_attention(attention, self.device, self.config.head_dim)
        self._graphs: Graphs = NoGraphs()
        base = self._kernels(cuda_graphs) if self.attention == "triton" else SdpaAttention(
            block_size=block_size, device=self.device, dtype=dtype)
        self.batch_attention = BlendAttention(
            base, device_pool=self.kv_cache.device_pool, cpu_pool=self.kv_cache.cpu_pool, block_size=block_size,
            inv_freq=self.model.rotary.inv_freq, num_layers=self.config.num_layers)

    def _kernels(self, cuda_graphs: bool) -> PackedAttention:
        """The Triton kernels; on CUDA with ``cuda_graphs``, decode steps replay graphs captured here."""
        from inference_svc.engine.paged_batch import KernelAttention

        kernels = KernelAttention(block_size=self.block_size, num_heads=self.config.num_heads,
                                  num_kv_heads=self.config.num_kv_heads, device=self.device)
        if cuda_graphs and self.device.type == "cuda":
            from inference_svc.engine.cuda_graphs import DecodeGraphs

            width = min(self.kv_cache.num_device_blocks, -(-self.config.max_position_embeddings // self.block_size))
            kernels.graphs = DecodeGraphs(kernels, self._forward, width=width)
        self._graphs = kernels.graphs
        return kernels

    @property
    def graph_replays(self) -> int:
        """Decode steps served by a CUDA graph so far."""
        return self._graphs.replays

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """End-of-sequence ids from config.json and generation_config.json."""
        return self.config.eos_token_ids

    @property
    def synchronous(self) -> bool:
        """True when `execute`'s results are ready without a device sync (a CPU; CUDA runs ahead)."""
        return self.device.type != "cuda"

    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """``[(device_block, cpu_block), ...]``."""
        self.kv_cache.swap_out(pairs)

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """``[(cpu_block, device_block), ...]``."""
        self.kv_cache.swap_in(pairs)

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """``[(src_device_block, dst_device_block), ...]``."""
        self.kv_cache.copy_blocks(pairs)

    def _validate(self, chunks: Sequence[ChunkInput]) -> None:
        if not chunks:
            raise ValueError("execute needs at least one chunk")
        cfg, bs = self.config, self.block_size
        for i, c in enumerate(chunks):
            n = len(c.token_ids)
            if n < 1:
                raise ValueError(f"chunk {i}: token_ids is empty")
            if c.start_pos < 0:
                raise ValueError(f"chunk {i}: start_pos {c.start_pos} is negative")
            end = c.start_pos + n
            if end > cfg.max_position_embeddings:
                raise ValueError(
                    f"chunk {i}: positions up to {end - 1} exceed the model's {cfg.max_position_embeddings} positions"
                )
            if c.want_logits and not 1 <= c.num_logits <= n:
                raise ValueError(f"chunk {i}: num_logits {c.num_logits} not in [1, {n}]")
            if min(c.token_ids) < 0 or max(c.token_ids) >= cfg.vocab_size:
                raise ValueError(f"chunk {i}: token id out of range [0, {cfg.vocab_size})")
            need = -(-end // bs)
            if len(c.block_table) < need:
                raise ValueError(
                    f"chunk {i}: block table has {len(c.block_table)} blocks, positions [0, {end}) need {need}"
                )
            used = c.block_table[:need]
            if min(used) < 0 or max(used) >= self.kv_cache.num_device_blocks:
                raise ValueError(f"chunk {i}: block id out of range [0, {self.kv_cache.num_device_blocks})")

    @torch.inference_mode()
    def execute(self, chunks: Sequence[ChunkInput]) -> torch.Tensor:
        """One forward over all chunks packed together.

        Returns float32 logits ``[n_want, vocab]`` on the runner's device: for each chunk with
        ``want_logits``, in the order of ``chunks``, one row per trailing token it asks for
        (``num_logits``, usually 1), in position order.
        """
        self._validate(chunks)
        logits = self.batch_attention.prepare(chunks).run(self._forward)
        for c in chunks:
            if c.reuse is not None and c.reuse.captures:
                store_captures(self.kv_cache.device_pool, c.reuse.captures, c.block_table, self.block_size)
        return logits

    def _forward(self, batch: Batch) -> torch.Tensor:
        """Float32 logits of the batch's logit rows."""
        hidden = self.model(batch.input_ids, batch.positions, batch.attention, self.kv_cache.layers)
        return self.model.compute_logits(hidden[batch.logit_rows])
