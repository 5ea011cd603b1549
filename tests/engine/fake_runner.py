"""A model-runner double whose "KV cache" stores token ids, so its outputs prove the KV is right.

Each device/CPU block holds the token ids written at its slots. A chunk that wants logits
reads its whole context back through its block table and predicts `next_token(context)`,
a hash of the tokens at every position. If the engine ever points a request at stale,
missing or foreign KV (a bad LCP cut, a lost swap, a wrong prefix-cache hit, a missed
copy-on-write), the prediction differs from `next_token(request.token_ids)`.
Used only at the model-runner seam; tests/engine/test_engine_real_model.py runs the real model.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch

from inference_svc.engine.model_runner import ChunkInput

VOCAB = 97
EOS = 0


def next_token(context: Sequence[int]) -> int:
    """Deterministic 'model': depends on every token and its position; never EOS."""
    acc = 7
    for i, t in enumerate(context):
        acc = (acc * 31 + (i + 1) * (t + 3)) % 1_000_003
    return 1 + acc % (VOCAB - 1)


class FakeRunner:
    def __init__(
        self, num_device_blocks: int, num_cpu_blocks: int, block_size: int = 4, max_position_embeddings: int = 4096,
        predict=next_token,
    ) -> None:
        self.predict = predict     # the 'model': context token ids -> next token
        self.block_size = block_size
        self.device_kv = torch.full((num_device_blocks, block_size), -1, dtype=torch.long)
        self.cpu_kv = torch.full((num_cpu_blocks, block_size), -1, dtype=torch.long)
        self.config = SimpleNamespace(max_position_embeddings=max_position_embeddings, vocab_size=VOCAB)
        self.device = torch.device("cpu")
        self.synchronous = True    # results are ready when execute returns (Runner.synchronous)
        self.eos_token_ids = (EOS,)
        self.executed_tokens = 0

    def execute(self, chunks: list[ChunkInput]) -> torch.Tensor:
        rows = []
        bs = self.block_size
        self.reused_tokens = 0
        for chunk in chunks:
            reused = self._load_reused(chunk)
            for offset, token in enumerate(chunk.token_ids):
                pos = chunk.start_pos + offset
                if pos not in reused:
                    self.device_kv[chunk.block_table[pos // bs], pos % bs] = token
            self.executed_tokens += len(chunk.token_ids)
            self.reused_tokens += len(reused)
            if chunk.want_logits:
                last = chunk.start_pos + len(chunk.token_ids)
                for end in range(last - chunk.num_logits + 1, last + 1):
                    context = [int(self.device_kv[chunk.block_table[p // bs], p % bs]) for p in range(end)]
                    logits = torch.zeros(VOCAB)
                    logits[self.predict(context)] = 1.0
                    rows.append(logits)
        for chunk in chunks:
            for capture in chunk.reuse.captures if chunk.reuse else ():
                for i in range(capture.length):
                    pos = capture.start + i
                    self.device_kv[capture.blocks[i // bs], i % bs] = self.device_kv[chunk.block_table[pos // bs],
                                                                                      pos % bs]
        return torch.stack(rows) if rows else torch.empty(0, VOCAB)

    def _load_reused(self, chunk: ChunkInput) -> set[int]:
        """Blend mode: the reused positions take the chunk store's "KV" (token ids) instead of the chunk's
        own, so a wrong entry or slot shows in the prediction. Returns those positions."""
        bs, positions = self.block_size, set()
        for span in chunk.reuse.spans if chunk.reuse else ():
            pool = self.cpu_kv if span.on_cpu else self.device_kv
            for i in range(span.length):
                src, pos = span.offset + i, span.start + i
                self.device_kv[chunk.block_table[pos // bs], pos % bs] = pool[span.blocks[src // bs], src % bs]
                positions.add(pos)
        return positions

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        for device_block, cpu_block in pairs:
            self.cpu_kv[cpu_block] = self.device_kv[device_block]  # the device copy stays valid (prefix cache)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        for cpu_block, device_block in pairs:
            self.device_kv[device_block] = self.cpu_kv[cpu_block]
            self.cpu_kv[cpu_block] = -3

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        for src, dst in pairs:
            self.device_kv[dst] = self.device_kv[src]


class CharTokenizer:
    """One token per character (codes folded into the fake vocabulary, never EOS)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + ord(c) % (VOCAB - 1) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)
