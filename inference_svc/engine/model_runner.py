"""Tensors in, logits out: one forward pass over packed chunks of several sequences.

A step mixes prefill chunks of some requests with decode tokens of others. The runner
packs all their new tokens into one batch (linear layers run over the concatenation),
writes their K/V into the paged cache, attends each sequence over its own blocks, and
computes the LM head only for the chunks that want next-token logits.

Which blocks a sequence owns, and what to swap or copy, is decided elsewhere (block
manager, scheduler); the runner owns the weights, the KV tensors and the math.

A chunk with `reuse` (blend mode, chunk_store.py) does the chunk store's work: a chunk that reuses
cached passages is loaded and run on its own (blend.py: keys re-rotated, the most deviating tokens
recomputed); the passages a chunk completes are captured after the forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from inference_svc.engine.attention import _slots, build_metadata
from inference_svc.engine.blend import load_spans, store_captures
from inference_svc.engine.chunk_store import ChunkReuse
from inference_svc.engine.kv_cache import KVCache, kv_bytes_per_block
from inference_svc.engine.models import ModelConfig, load_model, random_model
from inference_svc.engine.options import ATTENTION_CHOICES


@dataclass(frozen=True)
class ChunkInput:
    token_ids: Sequence[int]  # tokens to compute this step (>= 1)
    start_pos: int  # absolute position of token_ids[0]; KV for [0, start_pos) is already in the cache
    block_table: Sequence[int]  # device block ids covering positions [0, start_pos + len(token_ids))
    want_logits: bool  # return next-token logits of this chunk's last token
    num_logits: int = 1  # with want_logits: logits of this many trailing tokens (verifying a draft)
    reuse: ChunkReuse | None = None  # blend mode: cached passages to reuse, passages to capture (chunk_store.py)


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
        self._batch = self._graphs = None
        if self.attention == "triton":
            from inference_svc.engine.paged_batch import BatchBuilder

            self._batch = BatchBuilder(block_size=block_size, num_heads=self.config.num_heads,
                                       num_kv_heads=self.config.num_kv_heads, device=self.device)
            if cuda_graphs and self.device.type == "cuda":
                from inference_svc.engine.cuda_graphs import DecodeGraphs

                width = min(num_device_blocks, -(-self.config.max_position_embeddings // block_size))
                self._graphs = DecodeGraphs(self._batch, self._forward_fields, width=width)

    @property
    def graph_replays(self) -> int:
        """Decode steps served by a CUDA graph so far."""
        return 0 if self._graphs is None else self._graphs.replays

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
        blended = [i for i, c in enumerate(chunks) if c.reuse is not None and c.reuse.spans]
        logits = self._execute_with_blends(chunks, blended) if blended else self._execute_packed(chunks)
        for c in chunks:
            if c.reuse is not None and c.reuse.captures:
                store_captures(self.kv_cache.device_pool, c.reuse.captures, c.block_table, self.block_size)
        return logits

    def _execute_with_blends(self, chunks: Sequence[ChunkInput], blended: list[int]) -> torch.Tensor:
        """The plain chunks packed as usual, each blended chunk on its own; logits in the order of `chunks`."""
        plain = [i for i in range(len(chunks)) if i not in blended]
        rows: dict[int, torch.Tensor] = {}
        if plain:
            packed = self._execute_packed([chunks[i] for i in plain])
            row = 0
            for i in plain:
                if chunks[i].want_logits:
                    rows[i] = packed[row:row + chunks[i].num_logits]
                    row += chunks[i].num_logits
        for i in blended:
            out = self._execute_blend(chunks[i])
            if chunks[i].want_logits:
                rows[i] = out
        if not rows:
            return torch.empty(0, self.config.vocab_size, dtype=torch.float32, device=self.device)
        return torch.cat([rows[i] for i in sorted(rows)])

    def _execute_blend(self, c: ChunkInput) -> torch.Tensor:
        """One chunk that reuses cached passages (blend.py); its logits rows (none unless it wants them)."""
        bs, n = self.block_size, len(c.token_ids)
        end = c.start_pos + n
        load_spans(self.kv_cache.device_pool, self.kv_cache.cpu_pool, c.reuse.spans, c.block_table, bs,
                   self.model.rotary.inv_freq)
        reused = torch.zeros(n, dtype=torch.bool)
        for span in c.reuse.spans:
            reused[span.start - c.start_pos:span.start - c.start_pos + span.length] = True
        keep = torch.zeros(n, dtype=torch.bool)
        if c.want_logits:
            keep[n - c.num_logits:] = True
        ctx_slots = _slots(torch.tensor(list(c.block_table[: -(-end // bs)]), dtype=torch.long), end, bs)
        dev = self.device
        hidden, _ = self.model.forward_blend(
            torch.tensor(list(c.token_ids), dtype=torch.long, device=dev),
            torch.arange(c.start_pos, end, device=dev), ctx_slots.to(dev), ctx_slots[c.start_pos:].to(dev),
            reused.to(dev), keep.to(dev), c.reuse.recomputed_tokens, self.kv_cache.layers)
        if not c.want_logits:
            return torch.empty(0, self.config.vocab_size, dtype=torch.float32, device=dev)
        return self.model.compute_logits(hidden[-c.num_logits:])

    def _forward_fields(self, fields: dict[str, torch.Tensor], meta: object) -> torch.Tensor:
        """The kernels' forward over a packed batch on the device (paged_batch): logits of its logit rows."""
        hidden = self.model(fields["input_ids"], fields["positions"], meta, self.kv_cache.layers)
        return self.model.compute_logits(hidden[fields["logit_rows"]])

    def _execute_kernels(self, chunks: Sequence[ChunkInput]) -> torch.Tensor:
        """The Triton path: the batch in one buffer and one copy, a CUDA graph for decode-only steps."""
        from inference_svc.engine.paged_batch import Span

        spans = [Span(c.token_ids, c.start_pos, c.block_table, c.num_logits if c.want_logits else 0)
                 for c in chunks]
        if self._graphs is not None and self._graphs.fits(spans):
            return self._graphs.run(spans)
        host, layout, block_q = self._batch.pack(spans)
        return self._forward_fields(*self._batch.to_device(host, layout, block_q))

    def _execute_packed(self, chunks: Sequence[ChunkInput]) -> torch.Tensor:
        if self._batch is not None:
            return self._execute_kernels(chunks)
        # Single-token chunks first: attention batches them in one call.
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) > 1)
        ids: list[int] = []
        last_row = [0] * len(chunks)
        for i in order:
            ids.extend(chunks[i].token_ids)
            last_row[i] = len(ids) - 1
        packed = [chunks[i] for i in order]
        positions = torch.cat([torch.arange(c.start_pos, c.start_pos + len(c.token_ids)) for c in packed])
        meta = build_metadata(
            [(c.start_pos, len(c.token_ids), c.block_table) for c in packed], self.block_size, self.device, self.dtype
        )
        input_ids = torch.tensor(ids, dtype=torch.long).to(self.device)
        hidden = self.model(input_ids, positions.to(self.device), meta, self.kv_cache.layers)
        rows = [row for i, c in enumerate(chunks) if c.want_logits
                for row in range(last_row[i] - c.num_logits + 1, last_row[i] + 1)]
        if not rows:
            return torch.empty(0, self.config.vocab_size, dtype=torch.float32, device=self.device)
        return self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])
