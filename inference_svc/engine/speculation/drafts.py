"""The engine's drafts, end to end: which requests speculate, the drafts proposed before each step,
the logits rows turned into tokens (sampled, or verified against a draft), the acceptance counted,
and the logit gap of sampled rows for requests that track their confidence.

Per decoding request that speculates, each step:

1. `Speculation.propose` asks its `RequestSpeculation` for a draft: a depth from its controller
   (depth.py: fixed, or auto, capped by the gate, gate.py) and that many tokens from the n-gram
   proposer (proposer.py).
2. The scheduler appends the draft to the request's one-token decode chunk (verification tokens
   count in the step's token budget; they take only what complete work left).
3. The model computes logits at every drafted position in that one forward pass, and `verify`
   walks them: it samples the model's token at each position exactly as a non-speculative step
   would (argmax when greedy, the request's own sampler otherwise) and goes on while the sampled
   token equals the draft. The emitted tokens are the model's own samples, each conditioned on
   exactly the tokens before it, so greedy output is token-identical to non-speculative decoding
   and sampled output has the same distribution.
4. The engine keeps the KV of the accepted tokens and rolls back the rest, and hands the step's
   figures to `Speculation.observe`, which the gate measures drafts' worth from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from inference_svc.engine.speculation.depth import DepthController, DepthSettings
from inference_svc.engine.speculation.gate import GateSettings, SpeculationGate
from inference_svc.engine.speculation.proposer import DEFAULT_NGRAM_SIZES, NgramProposer

if TYPE_CHECKING:
    from inference_svc.engine.request import Request
    from inference_svc.engine.sampler import SamplingParams
    from inference_svc.engine.scheduler import ScheduledChunk
    from inference_svc.engine.step_timing import StepStats

# Tokens for logits rows of the given requests, one each: the engine's sampler with each request's generator.
SampleRows = Callable[[torch.Tensor, "list[Request]"], "list[int]"]


def verify(draft: Sequence[int], sample_row: Callable[[int], int]) -> list[int]:
    """The tokens a verification step emits: the model's token at each position (`sample_row(i)`
    for logits row i, drawn in order), while it equals the draft; the first mismatch, or the
    token after a fully accepted draft, ends it. `len(result) - 1` drafts were accepted."""
    emitted = []
    for i in range(len(draft) + 1):
        token = sample_row(i)
        emitted.append(token)
        if i == len(draft) or token != draft[i]:
            break
    return emitted


class RequestSpeculation:
    """What one request keeps between steps: its n-gram index and its depth controller."""

    def __init__(self, fixed_depth: int | None, settings: DepthSettings | None = None,
                 ngram_sizes: Sequence[int] = DEFAULT_NGRAM_SIZES) -> None:
        self.proposer = NgramProposer(ngram_sizes)
        self.controller = DepthController(fixed_depth, settings or DepthSettings())

    def draft(self, tokens: Sequence[int], max_tokens: int, load: float, share: int, batch_emitted: float = 1.0,
              batch_tokens: float = 1.0) -> list[int]:
        """A draft of at most `max_tokens` tokens continuing `tokens` (empty: decode normally)."""
        depth = min(self.controller.depth(load, share, batch_emitted, batch_tokens), max_tokens)
        if depth <= 0:
            return []
        self.proposer.sync(tokens)
        return self.proposer.propose(depth)



class Speculation:
    """The engine's side of speculative decoding (module docstring). `counters` is the engine's
    (`draft_tokens`, `accepted_draft_tokens`); `gate` None leaves auto depths uncapped."""

    def __init__(self, counters: Any, draft_budget: int, settings: DepthSettings, ngram_sizes: Sequence[int],
                 gate: GateSettings | None) -> None:
        self.counters = counters
        self.draft_budget = draft_budget
        self.settings = settings
        self.ngram_sizes = tuple(ngram_sizes)
        self.gate = None if gate is None else SpeculationGate(gate, settings.cost_ratio)
        self._requests: dict[str, RequestSpeculation] = {}
        self._fixed_drafted = False     # the step verifies fixed-depth drafts: the gate does not judge it

    def add(self, request_id: str, sampling: SamplingParams) -> None:
        if sampling.speculation_depth != 0:
            self._requests[request_id] = RequestSpeculation(sampling.speculation_depth, self.settings,
                                                            self.ngram_sizes)

    def remove(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def propose(self, requests: Mapping[str, Request], max_sequence_tokens: int, last: StepStats,
                token_budget: int) -> dict[str, list[int]]:
        """Draft tokens for each decoding request that speculates, by request id. Auto depths share
        `draft_budget`, shrink when prefill took the last step's budget, and stay under the gate's cap."""
        decoding = [requests[rid] for rid in self._requests]
        decoding = [r for r in decoding if r.is_decoding and r.num_pending_tokens == 1 and not r.is_finished]
        self._fixed_drafted = False
        if not decoding:
            return {}
        num_auto = sum(1 for r in decoding if self._requests[r.request_id].controller.fixed_depth is None)
        share = max(1, self.draft_budget // max(num_auto, 1))
        if self.gate is not None and num_auto:
            cap = self.gate.cap(sum(1 for r in requests.values() if r.is_decoding and not r.is_finished))
            share = share if cap is None else min(share, cap)
        load = (last.tokens - last.draft_tokens) / token_budget
        drafts = {}
        for request in decoding:
            speculation = self._requests[request.request_id]
            auto = speculation.controller.fixed_depth is None
            if auto and share == 0:
                continue
            room = min(request.sampling.max_tokens - len(request.output_token_ids),
                       max_sequence_tokens - request.num_tokens) - 1
            draft = speculation.draft(request.token_ids, room, load, share, last.emitted, last.decode_tokens)
            if draft:
                drafts[request.request_id] = draft
                self._fixed_drafted |= not auto
        return drafts

    def take_tokens(self, chunks: Sequence[ScheduledChunk], logits: torch.Tensor,
                    sample: SampleRows) -> dict[int, list[int]]:
        """The tokens each chunk that wants logits emits, by `id(chunk)`: one sampled token (its row's),
        or a draft's verified tokens (its rows')."""
        plain: list[tuple[ScheduledChunk, torch.Tensor]] = []      # one logits row each
        verifying: list[tuple[ScheduledChunk, torch.Tensor]] = []  # a row per drafted position
        row = 0
        for chunk in chunks:
            if chunk.wants_logits:
                rows = 1 + len(chunk.draft)
                (verifying if chunk.draft else plain).append((chunk, logits[row:row + rows]))
                row += rows
        tokens = sample(torch.cat([rows for _, rows in plain]), [c.request for c, _ in plain]) if plain else []
        emitted = {id(chunk): [token] for (chunk, _), token in zip(plain, tokens, strict=True)}
        note_confidence(plain)
        for chunk, rows in verifying:
            emitted[id(chunk)] = self._verify(chunk, rows, sample)
        return emitted

    def _verify(self, chunk: ScheduledChunk, rows: torch.Tensor, sample: SampleRows) -> list[int]:
        """The tokens a draft's verification emits (`verify`), and its acceptance noted."""
        request = chunk.request
        if request.sampling.greedy:
            choices = rows.argmax(dim=-1).tolist()
            emitted = verify(chunk.draft, choices.__getitem__)
        else:
            emitted = verify(chunk.draft, lambda i: sample(rows[i:i + 1], [request])[0])
        accepted = len(emitted) - 1
        self._requests[request.request_id].controller.observe(len(chunk.draft), accepted)
        request.stats.draft_tokens += len(chunk.draft)
        request.stats.accepted_draft_tokens += accepted
        self.counters.draft_tokens += len(chunk.draft)
        self.counters.accepted_draft_tokens += accepted
        return emitted

    def observe(self, step: StepStats) -> None:
        """The gate measures a decode-only step (not one with prefill, nor one verifying fixed-depth drafts)."""
        if self.gate is None or not step.tokens or step.decode_tokens != step.tokens or self._fixed_drafted:
            return
        self.gate.observe(step.tokens - step.draft_tokens, step.draft_tokens, step.emitted, step.ms, len(step.depths))


def note_confidence(plain: Sequence[tuple[ScheduledChunk, torch.Tensor]]) -> None:
    """The logit gap of each sampled row, for requests that track it (Flash Queries)."""
    for chunk, rows in plain:
        request = chunk.request
        if request.track_confidence:
            top = torch.topk(rows[-1].float(), 2).values
            gap = float(top[0] - top[1])
            request.min_logit_gap = gap if request.min_logit_gap is None else min(request.min_logit_gap, gap)
