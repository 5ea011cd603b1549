"""The one attention interface of a forward: ``prepare`` a step's chunks, then ``attend`` in every layer.

The runner picks a ``BatchAttention`` once, at start-up, and every step goes through it:

- ``prepare(chunks)`` packs the step (token ids, positions, each new token's cache slot, whatever the
  attention reads) and returns a ``Batch``: the packed tokens on the device, the rows whose logits
  are wanted, and the attention the model's layers call;
- in each layer, ``narrow(layer, k, v, ...)`` may drop rows before attention (blend recomputes only
  the reused tokens that deviate most: the others keep their cached KV from there on), then
  ``attend(q, k, v, k_cache, v_cache)`` stores the new K/V in the paged cache and attends.

Implementations: ``SdpaAttention`` (attention.py, the CPU's), ``KernelAttention`` (paged_batch.py,
the Triton kernels, the GPU's) and ``BlendAttention`` (blend.py), which runs chunks that reuse cached
passages through either of the other two (``pack`` of ``Span``s, rows at any positions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from inference_svc.engine.chunk_store import ChunkReuse


@dataclass(frozen=True)
class ChunkInput:
    token_ids: Sequence[int]  # tokens to compute this step (>= 1)
    start_pos: int  # absolute position of token_ids[0]; KV for [0, start_pos) is already in the cache
    block_table: Sequence[int]  # device block ids covering positions [0, start_pos + len(token_ids))
    want_logits: bool  # return next-token logits of this chunk's last token
    num_logits: int = 1  # with want_logits: logits of this many trailing tokens (verifying a draft)
    reuse: ChunkReuse | None = None  # blend mode: cached passages to reuse, passages to capture (chunk_store.py)


@dataclass(frozen=True)
class Span:
    """One sequence's rows of a batch: ``token_ids`` at positions ``start, start + 1, ...`` (or at the
    ascending ``positions`` given: a blend's rows, with gaps), its block table, and how many trailing
    rows want logits (0: none)."""

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    num_logits: int
    positions: Sequence[int] | None = None

    @property
    def end(self) -> int:
        """One past the last position."""
        return (self.positions[-1] if self.positions is not None else self.start + len(self.token_ids) - 1) + 1

    @property
    def contiguous(self) -> bool:
        return self.positions is None


def span_of(chunk: ChunkInput) -> Span:
    return Span(chunk.token_ids, chunk.start_pos, chunk.block_table, chunk.num_logits if chunk.want_logits else 0)


@dataclass(frozen=True)
class Batch:
    """A step's packed tokens on the device, and what the forward does with them."""

    input_ids: torch.Tensor      # [T]
    positions: torch.Tensor      # [T]
    logit_rows: torch.Tensor     # rows of the last layer's output that give logits, in the order of the chunks
    attention: BatchAttention    # what every layer calls
    starts: tuple[int, ...] = ()  # each span's first row, in the order of the spans

    def run(self, forward: Forward) -> torch.Tensor:
        """Logits ``[len(logit_rows), vocab]``: ``forward(self)`` (a CUDA graph's batch replays instead)."""
        return forward(self)


Forward = Callable[[Batch], torch.Tensor]


class BatchAttention(Protocol):
    def prepare(self, chunks: Sequence[ChunkInput]) -> Batch:
        """Pack a step's chunks; the batch's attention serves its forward."""

    def narrow(self, layer: int, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor | None:
        """The rows that go on from ``layer`` on (indices into the current rows), or None: all of them."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor:
        """Store the new ``k``/``v`` ``[kv_heads, T, D]`` in the layer's cache ``[slots, kv_heads, D]`` and
        attend ``q`` ``[heads, T, D]``; returns ``[T, heads * D]``."""


class PackedAttention(BatchAttention, Protocol):
    """An implementation that packs any spans (blend runs through it)."""

    def pack(self, spans: Sequence[Span]) -> Batch:
        """Pack ``spans`` (in their order, or the implementation's) and attend them from now on."""


class Graphs(Protocol):
    replays: int       # steps served by a graph so far
    max_batch: int

    def fits(self, spans: Sequence[Span]) -> bool:
        """A graph holds this step."""

    def batch(self, spans: Sequence[Span]) -> Batch:
        """The step packed into its graph's buffer; the batch's ``run`` replays the graph."""


class NoGraphs:
    """No CUDA graphs (on a CPU, or turned off): every step runs eagerly."""

    replays = 0
    max_batch = 0

    def fits(self, spans: Sequence[Span]) -> bool:
        return False

    def batch(self, spans: Sequence[Span]) -> Batch:
        raise AssertionError("fits() is never true")
