"""CUDA graphs of the decode forward: captured once at start-up per batch-size bucket, replayed per step.

A decode step of an 8B model is a few hundred small kernels; launched one by one from Python the
GPU idles most of the step. A graph replays all of them with one launch. Each bucket (1, 2, 4, 8,
16, 32, 64 sequences by default, as vLLM does) owns a static batch buffer (paged_batch.Layout with
the bucket's sizes and the widest block table the pool allows) and a static logits tensor; a step
with B decodes is packed into the smallest bucket that holds it (the other rows are padding: no
query rows, slot -1, so they read and write nothing), copied in with one transfer, and replayed.

Everything the graph reads per step lives in that buffer, the kernels' loop bounds included, so a
context length never seen before replays the same graph. The buckets share one memory pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference_svc.engine.batch_attention import Batch, Forward, Span
from inference_svc.engine.paged_batch import KernelAttention, Layout

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class GraphBatch(Batch):
    """A step packed into a bucket's buffer: ``run`` replays the bucket's graph."""

    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None

    def run(self, forward: Forward) -> torch.Tensor:
        self.graph.replay()
        return self.logits


class DecodeGraphs:
    """The ``Graphs`` of a ``KernelAttention`` (paged_batch.py) on CUDA."""

    def __init__(self, attention: KernelAttention, forward: Forward, *, width: int,
                 buckets: Sequence[int] = DEFAULT_BUCKETS) -> None:
        self.attention = attention
        self.builder = attention.builder
        self.width = width
        self.buckets = tuple(sorted(set(buckets)))
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, int]] = {}
        self.replays = 0
        self._capture(forward)

    def _layout(self, size: int) -> Layout:
        return Layout(tokens=size, seqs=size, tiles=size, width=self.width, rows=size)

    @torch.inference_mode()
    def _capture(self, forward: Forward) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        for size in reversed(self.buckets):             # the largest first: the others fit in its pool
            layout = self._layout(size)
            host, _, block_q = self.builder.pack([], layout)
            buffer = torch.empty(layout.numel, dtype=torch.int32, device=self.builder.device)
            batch = self.attention.batch(*self.builder.to_device(host, layout, block_q, into=buffer))
            with torch.cuda.stream(stream):
                forward(batch)                          # compile and warm up outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                logits = forward(batch)
            self._graphs[size] = (graph, buffer, logits, block_q)
        torch.cuda.synchronize()

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def fits(self, spans: Sequence[Span]) -> bool:
        """Decodes only, one logits row each, within the largest bucket and the captured table width."""
        bs = self.builder.block_size
        return (0 < len(spans) <= self.max_batch
                and all(s.contiguous and len(s.token_ids) == 1 and s.num_logits == 1 for s in spans)
                and all(-(-(s.start + 1) // bs) <= self.width for s in spans))

    def batch(self, spans: Sequence[Span]) -> Batch:
        """One decode step packed into the smallest bucket that holds it; its ``run`` replays the graph."""
        size = next(b for b in self.buckets if b >= len(spans))
        graph, buffer, logits, block_q = self._graphs[size]
        host, layout, _ = self.builder.pack(spans, self._layout(size))
        fields, _ = self.builder.to_device(host, layout, block_q, into=buffer)
        self.replays += 1
        return GraphBatch(fields["input_ids"], fields["positions"], fields["logit_rows"], self.attention,
                          graph=graph, logits=logits[:len(spans)])
