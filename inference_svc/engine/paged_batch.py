"""A step's batch for the Triton kernels, packed into one integer buffer and copied in one transfer.

Everything a forward over the paged cache reads besides the weights and the cache (token ids,
positions, each token's cache slot, each sequence's rows and block table, the query tiles,
and the rows whose logits are wanted) is written on the host into one int32 buffer, pinned on CUDA,
and copied to the device with one non-blocking copy. The fields are views into the device copy, so
a step issues no other host-to-device copy, builds no mask, and never waits for the device.

A CUDA graph (cuda_graphs.py) keeps one such device buffer per batch-size bucket: the layout has
fixed sizes there (``capacity``), and the padded sequences have no query rows and slot -1.

A span of rows at gapped positions (a blend's) is one sequence like any other: the kernels read each
row's position. ``KernelAttention`` is the GPU's ``BatchAttention`` (batch_attention.py) over these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from inference_svc.engine import triton_attention
from inference_svc.engine.batch_attention import Batch, ChunkInput, Graphs, NoGraphs, Span, span_of

FIELDS = ("input_ids", "positions", "slot_mapping", "logit_rows",
          "seq_q_start", "seq_q_len", "tile_seq", "tile_off", "block_tables")


def _aligned(size: int) -> int:
    """Every field starts on 16 bytes (four int32s): Triton specializes kernels on a pointer's alignment,
    and fields at varying alignments would compile a variant per alignment."""
    return -(-size // 4) * 4


@dataclass(frozen=True)
class Layout:
    """Sizes of a batch buffer: tokens, sequences, query tiles, block-table width and logit rows."""

    tokens: int
    seqs: int
    tiles: int
    width: int
    rows: int

    def sizes(self) -> dict[str, int]:
        t, s, n = self.tokens, self.seqs, self.tiles
        return dict(input_ids=t, positions=t, slot_mapping=t, logit_rows=self.rows, seq_q_start=s, seq_q_len=s,
                    tile_seq=n, tile_off=n, block_tables=s * self.width)

    @property
    def numel(self) -> int:
        return sum(_aligned(size) for size in self.sizes().values())

    @property
    def tables_at(self) -> int:
        """Where the block tables (the last field) start."""
        return sum(_aligned(size) for name, size in self.sizes().items() if name != "block_tables")

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        out, at = {}, 0
        for name, size in self.sizes().items():
            out[name] = buffer[at:at + size]
            at += _aligned(size)
        out["block_tables"] = out["block_tables"].view(self.seqs, self.width)
        return out


@dataclass(frozen=True)
class KernelMetadata:
    """The attention fields of a batch on the device (views into its buffer); shared by every layer."""

    fields: dict[str, torch.Tensor]
    block_q: int
    page_size: int


class BatchBuilder:
    """Packs spans into a host buffer laid out by ``Layout``; ``to_device`` makes the metadata."""

    def __init__(self, *, block_size: int, num_heads: int, num_kv_heads: int, device: torch.device) -> None:
        self.block_size = block_size
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.device = device
        self._pin = device.type == "cuda"

    def block_q(self, decode_only: bool) -> int:
        return triton_attention.tile_tokens(self.num_heads, self.num_kv_heads, decode_only=decode_only)

    def layout(self, spans: Sequence[Span], bq: int) -> Layout:
        """The exact sizes ``spans`` need, in tiles of ``bq`` query tokens."""
        return Layout(tokens=sum(len(s.token_ids) for s in spans), seqs=len(spans),
                      tiles=sum(-(-len(s.token_ids) // bq) for s in spans),
                      width=max(-(-s.end // self.block_size) for s in spans),
                      rows=sum(s.num_logits for s in spans))

    def pack(self, spans: Sequence[Span], layout: Layout | None = None) -> tuple[torch.Tensor, Layout, int]:
        """(host buffer, its layout, block_q). With a fixed ``layout`` (a graph's), the spans must fit in
        it: the rest is padding (no rows, slot -1, tiles of the first padding sequence, which has no rows).
        The host buffer ends after the last used row of the block tables: the padded rows are never read,
        so they are neither written nor copied."""
        bq = self.block_q(all(len(s.token_ids) == 1 for s in spans))
        layout = layout or self.layout(spans, bq)
        tables_at = layout.tables_at
        host = torch.empty(layout.numel, dtype=torch.int32, pin_memory=self._pin)
        host[:tables_at].zero_()
        f = {name: view.numpy() for name, view in layout.views(host).items()}
        f["slot_mapping"][:] = -1
        bs, row, tile, logit = self.block_size, 0, 0, 0
        for i, s in enumerate(spans):
            n = len(s.token_ids)
            table = np.asarray(s.block_table[: -(-s.end // bs)], dtype=np.int64)
            positions = np.arange(s.start, s.end) if s.contiguous else np.asarray(s.positions, dtype=np.int64)
            f["input_ids"][row:row + n] = s.token_ids
            f["positions"][row:row + n] = positions
            f["slot_mapping"][row:row + n] = table[positions // bs] * bs + positions % bs
            f["seq_q_start"][i], f["seq_q_len"][i] = row, n
            f["block_tables"][i, :table.shape[0]] = table
            tiles = -(-n // bq)
            f["tile_seq"][tile:tile + tiles] = i
            f["tile_off"][tile:tile + tiles] = np.arange(0, n, bq)
            f["logit_rows"][logit:logit + s.num_logits] = np.arange(row + n - s.num_logits, row + n)
            row, tile, logit = row + n, tile + tiles, logit + s.num_logits
        f["tile_seq"][tile:] = len(spans)   # padding tiles (a graph's bucket): the first padding sequence's
        return host[:tables_at + len(spans) * layout.width], layout, bq

    def to_device(self, host: torch.Tensor, layout: Layout, block_q: int,
                  into: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], KernelMetadata]:
        """Copy ``host`` to the device (into ``into`` when given: a graph's static buffer) in one transfer."""
        device_buffer = into if into is not None else torch.empty(layout.numel, dtype=host.dtype, device=self.device)
        device_buffer = device_buffer[:layout.numel]
        device_buffer[:host.numel()].copy_(host, non_blocking=self._pin)
        fields = layout.views(device_buffer)
        return fields, KernelMetadata(fields, block_q, self.block_size)


class KernelAttention:
    """The GPU's ``BatchAttention``: a step packed by ``BatchBuilder``, two kernel launches per layer, and
    a decode-only step replayed from a CUDA graph when ``graphs`` (cuda_graphs.py) holds it."""

    def __init__(self, *, block_size: int, num_heads: int, num_kv_heads: int, device: torch.device) -> None:
        self.builder = BatchBuilder(block_size=block_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                    device=device)
        self.graphs: Graphs = NoGraphs()   # or DecodeGraphs, captured by the runner over this attention
        self.meta: KernelMetadata | None = None

    def prepare(self, chunks: Sequence[ChunkInput]) -> Batch:
        spans = [span_of(c) for c in chunks]
        return self.graphs.batch(spans) if self.graphs.fits(spans) else self.pack(spans)

    def pack(self, spans: Sequence[Span]) -> Batch:
        """``spans`` in their order, on the device in one copy."""
        host, layout, block_q = self.builder.pack(spans)
        starts = tuple(accumulate((len(s.token_ids) for s in spans[:-1]), initial=0))
        return self.batch(*self.builder.to_device(host, layout, block_q), starts=starts)

    def batch(self, fields: dict[str, torch.Tensor], meta: KernelMetadata, starts: tuple[int, ...] = ()) -> Batch:
        """The batch of ``fields`` (on the device); the layers attend with ``meta`` from now on."""
        self.meta = meta
        return Batch(fields["input_ids"], fields["positions"], fields["logit_rows"], self, starts)

    def narrow(self, layer: int, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor | None:
        return None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor:
        """Store the new ``k``/``v`` ``[kv_heads, T, D]`` and attend ``q`` ``[heads, T, D]``; ``[T, heads * D]``."""
        meta = self.meta
        f = meta.fields
        triton_attention.store_kv(k, v, k_cache, v_cache, f["slot_mapping"])
        num_heads, t, head_dim = q.shape
        out = q.new_empty(t, num_heads, head_dim)
        triton_attention.paged_attention(
            q, k_cache, v_cache, out, block_tables=f["block_tables"], positions=f["positions"],
            seq_q_start=f["seq_q_start"], seq_q_len=f["seq_q_len"], tile_seq=f["tile_seq"],
            tile_off=f["tile_off"], block_q=meta.block_q, page_size=meta.page_size)
        return out.view(t, num_heads * head_dim)
