"""The limits a served prompt and a served KV pool must meet, written once for both backends.

- At start-up (`inference_svc.server`, before any engine starts): the device pool must hold one whole
  sequence of the longest length served (`--max-model-len`, default the model's context), plus the
  blocks the backend keeps for itself (vLLM holds one null block back). Otherwise the service exits at
  once with one line naming the flag and a value that works (`check_pool_holds_context`); before this,
  vLLM started, failed inside its engine core and the process exited minutes later.
- Per request: token ids in the vocabulary and room for one generated token within the longest
  sequence served, `min(context, pool tokens)` (`PromptLimits`). The native engine enforces the same
  rule on its own requests (`Engine._check_fits`, below this package); the vLLM backend checks
  with `PromptLimits` before vLLM sees the prompt. Both answer with the same `PromptTooLongError`
  text, hence the same RESOURCE_EXHAUSTED status and message (tests/service/test_backend_parity.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from inference_svc.engine.engine import EngineInputError, PromptTooLongError
from inference_svc.engine.request import Segment

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PoolTooSmall(ValueError):
    """A device pool that cannot hold one whole sequence of the length served (refused at start-up)."""


@dataclass(frozen=True)
class ModelShape:
    """What the pool check needs from a model directory's config.json (no torch, no transformers)."""

    context_tokens: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> ModelShape:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        heads = config["num_attention_heads"]
        return cls(context_tokens=int(config["max_position_embeddings"]), num_layers=int(config["num_hidden_layers"]),
                   num_kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or config["hidden_size"] // heads))

    def bytes_per_block(self, block_size: int, dtype: str) -> int:
        """K and V of every layer for `block_size` tokens (the footprint both backends allocate)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * block_size * DTYPE_BYTES[dtype]


def served_len(context_tokens: int, max_model_len: int | None) -> int:
    """The longest sequence (prompt + answer) served: `--max-model-len`, at most the model's context."""
    return context_tokens if max_model_len is None else min(max_model_len, context_tokens)


def blocks_needed(sequence_tokens: int, block_size: int, reserved_blocks: int = 0) -> int:
    """Blocks a pool needs to hold one sequence of `sequence_tokens`, with the backend's reserved blocks."""
    return -(-sequence_tokens // block_size) + reserved_blocks


def check_pool_holds_context(*, sequence_tokens: int, block_size: int, blocks: int, reserved_blocks: int = 0,
                             flag: str = "--kv-device-blocks", bytes_per_block: int | None = None,
                             context_tokens: int | None = None) -> None:
    """Raise `PoolTooSmall` (one line: the flag, a value that works) unless `blocks` hold one sequence.

    `flag` names what the caller set: `--kv-device-blocks` (the value is in blocks) or
    `--kv-device-bytes` (then `bytes_per_block` turns the answer into bytes). `context_tokens`: the
    model's context, named when `sequence_tokens` is a shorter `--max-model-len`."""
    need = blocks_needed(sequence_tokens, block_size, reserved_blocks)
    if blocks >= need:
        return
    usable_tokens = max(0, blocks - reserved_blocks) * block_size
    given = blocks if bytes_per_block is None else blocks * bytes_per_block
    works = need if bytes_per_block is None else need * bytes_per_block
    what = "context" if context_tokens in (None, sequence_tokens) else "--max-model-len sequence"
    shorter = f", or --max-model-len {usable_tokens} to serve shorter sequences" if usable_tokens else ""
    reserved = f" ({reserved_blocks} kept by the backend)" if reserved_blocks else ""
    raise PoolTooSmall(f"{flag} {given} holds {usable_tokens} tokens in {block_size}-token blocks{reserved}, "
                       f"less than one {sequence_tokens}-token {what}: use {flag} {works} or more{shorter}")


class PromptLimits:
    """What a prompt must satisfy: token ids in the vocabulary, and room for one generated token within
    the longest sequence served, `min(max_model_len, pool tokens)` (the native engine's rule)."""

    def __init__(self, vocab_size: int, max_model_len: int, pool_tokens: int) -> None:
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.pool_tokens = pool_tokens

    @property
    def max_sequence_tokens(self) -> int:
        return min(self.max_model_len, self.pool_tokens)

    def check_ids(self, segments: Sequence[Segment]) -> None:
        for segment in segments:
            if segment.token_ids is not None and any(not 0 <= t < self.vocab_size for t in segment.token_ids):
                raise EngineInputError(f"token ids must be in [0, {self.vocab_size})")

    def check_fits(self, num_tokens: int) -> None:
        limit = self.max_sequence_tokens - 1   # room for at least one generated token
        if num_tokens > limit:
            raise PromptTooLongError(f"prompt too long: {num_tokens} tokens; the limit is {limit} (model context "
                                     f"{self.max_model_len}, device pool {self.pool_tokens} tokens)")
