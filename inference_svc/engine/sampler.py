"""Next-token choice from logits: greedy, or temperature / top-k / top-p sampling.

Filtering is vectorised over all sampled rows (one sort); the final draw uses each
request's own ``torch.Generator`` when it has a seed, so a seeded request gives the same
tokens whatever else shares its batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from inference_svc.engine.options import DEFAULT_SPECULATION, check_kv_reuse, parse_speculation

MAX_TOKENS_LIMIT = 1 << 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()   # stop strings: the output ends before the first one (see output_text.py)
    speculation: str = DEFAULT_SPECULATION   # "off", "auto" or a fixed draft depth "k" (options.parse_speculation)
    kv_reuse: str = ""                       # "exact", "blend" or "" (the engine's default): options.KV_REUSE_CHOICES
    blend_recompute: float | None = None     # blend: share of reused tokens recomputed; None: the engine's default

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def speculation_depth(self) -> int | None:
        """The fixed draft depth asked for (0: off), or None for auto."""
        return parse_speculation(self.speculation)

    def validate(self) -> SamplingParams:
        """Raise ``ValueError`` on out-of-range values; return ``self`` for chaining."""
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"max_tokens must be an int, got {self.max_tokens!r}")
        if not (1 <= self.max_tokens <= MAX_TOKENS_LIMIT):
            raise ValueError(f"max_tokens must be in [1, {MAX_TOKENS_LIMIT}], got {self.max_tokens}")
        if self.seed is not None and (not isinstance(self.seed, int) or not (0 <= self.seed < 2**63)):
            raise ValueError(f"seed must be an int in [0, 2**63), got {self.seed!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        if any(not isinstance(s, str) or not 1 <= len(s) <= MAX_STOP_STRING_CHARS for s in self.stop):
            raise ValueError(f"stop strings must be non-empty and at most {MAX_STOP_STRING_CHARS} characters")
        parse_speculation(self.speculation)
        check_kv_reuse(self.kv_reuse, self.blend_recompute)
        return self


def make_generator(params: SamplingParams, device: str | torch.device = "cpu") -> torch.Generator | None:
    """A generator seeded from ``params.seed`` on ``device`` (where the logits live), or None."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


class Sampler:
    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
    ) -> list[int]:
        """One token per row of ``logits`` ``[n, vocab]``; generators must live on the logits' device."""
        n = logits.shape[0]
        if len(params) != n or len(generators) != n:
            raise ValueError(f"{n} logit rows but {len(params)} params and {len(generators)} generators")
        tokens = logits.argmax(dim=-1)
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if sampled:
            rows = torch.tensor(sampled, device=logits.device)
            chosen = self._sample_rows(
                logits[rows].float(), [params[i] for i in sampled], [generators[i] for i in sampled]
            )
            tokens[rows] = chosen
        return tokens.tolist()

    @staticmethod
    def _sample_rows(
        logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
    ) -> torch.Tensor:
        device, vocab = logits.device, logits.shape[-1]
        temperature = torch.tensor([p.temperature for p in params], device=device)[:, None]
        top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)[:, None]
        top_p = torch.tensor([p.top_p for p in params], device=device)[:, None]

        sorted_logits, order = (logits / temperature).sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=device)[None, :]
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        keep = (rank < top_k) & ((mass_before < top_p) | (rank == 0))  # the best token always stays
        probs = torch.where(keep, probs, 0.0)

        picks = torch.empty(len(params), dtype=torch.long, device=device)
        unseeded = [i for i, g in enumerate(generators) if g is None]
        if unseeded:
            idx = torch.tensor(unseeded, device=device)
            picks[idx] = torch.multinomial(probs[idx], 1).view(-1)
        for i, g in enumerate(generators):
            if g is not None:
                picks[i] = torch.multinomial(probs[i], 1, generator=g)[0]
        return order.gather(1, picks[:, None]).view(-1)


class _SamplingRequest(Protocol):
    request_id: str
    sampling: SamplingParams


class RequestSampler:
    """Samples rows of requests, one each: a seeded request draws from its own generator, made on
    the logits' device at its first draw (where the model runs, never named here)."""

    def __init__(self, sampler: Sampler | None = None) -> None:
        self.sampler = sampler or Sampler()
        self._generators: dict[str, torch.Generator | None] = {}

    def sample(self, logits: torch.Tensor, requests: Sequence[_SamplingRequest]) -> list[int]:
        generators = []
        for request in requests:
            if request.request_id not in self._generators:
                self._generators[request.request_id] = make_generator(request.sampling, logits.device)
            generators.append(self._generators[request.request_id])
        return self.sampler.sample(logits, [r.sampling for r in requests], generators)

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
