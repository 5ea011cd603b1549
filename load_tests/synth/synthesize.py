"""Synthesis: the parameters, each query's chunks drawn from its workload model, and the header.

`synthesize` is deterministic in its `SynthParams` and the passage pool. Scaling:
`token_scale` multiplies the token targets and `max_prompt_tokens` caps a query's context
(default: the embedded model's 8192 tokens less 1024 for the head, question, suffix and
output; 0: no cap); `time_scale` multiplies every time (gaps and retrieval time) and is
written to the header's `time_scale`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from load_tests.synth.fitting import fit_split_lognormal, lognormal_quantile, stratified_uniforms
from load_tests.synth.models import MODELS, WORKLOADS, WorkloadModel
from load_tests.synth.passage_pool import PassagePool
from load_tests.synth.published import CALIBRATION_SOURCE, PUBLISHED, scaled_targets
from load_tests.synth.tokens import TokenCounter
from retriever_svc.replay.trace import TraceChunk, TraceDocument, TraceHeader, TraceQuery, TraceStage

GENERATOR = "streamrag trace synth"
EMBEDDED_CONTEXT_TOKENS = 8192
PROMPT_MARGIN_TOKENS = 1024          # chat head, instructions, question, suffix and the answer
DEFAULT_MAX_PROMPT_TOKENS = EMBEDDED_CONTEXT_TOKENS - PROMPT_MARGIN_TOKENS
MIN_DOC_TOKENS = 8


@dataclass(frozen=True)
class SynthParams:
    workload: str
    queries: int = 200
    token_scale: float = 0.1
    time_scale: float = 1.0
    seed: int = 0
    top_k: int = 10
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS     # 0: no cap

    def check(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {list(WORKLOADS)}, got {self.workload!r}")
        if self.queries < 1:
            raise ValueError(f"--queries must be at least 1, got {self.queries}")
        for name in ("token_scale", "time_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a number > 0, got {value}")
        if self.top_k < 1:
            raise ValueError(f"--top-k must be at least 1, got {self.top_k}")
        if self.max_prompt_tokens < 0:
            raise ValueError(f"--max-prompt-tokens must be >= 0, got {self.max_prompt_tokens}")


def split_tokens(total: int, weights: Sequence[float], minimum: int) -> list[int]:
    """`total` split in proportion to `weights`, each part at least `minimum` (largest remainders)."""
    n = len(weights)
    spare = max(0, total - n * minimum)
    shares = [spare * w / sum(weights) for w in weights]
    parts = [minimum + math.floor(s) for s in shares]
    order = sorted(range(n), key=lambda i: shares[i] - math.floor(shares[i]), reverse=True)
    for i in order[:spare - sum(math.floor(s) for s in shares)]:
        parts[i] += 1
    return parts


def _times(model: WorkloadModel, rng: random.Random, counts: Sequence[int]) -> list[list[float]]:
    """Each query's chunk times (seconds, real time): first-chunk time, then the gaps."""
    gap_u = stratified_uniforms(rng, sum(n - 1 for n in counts)) if sum(counts) > len(counts) else []
    gaps = [lognormal_quantile(u, math.log(model.gap_median_s), model.gap_sigma) for u in gap_u]
    first = [lognormal_quantile(u, 0.0, model.first_sigma) for u in stratified_uniforms(rng, len(counts))]
    # Scale the first-chunk times so the mean retrieval time is the published one (at least 5% of it).
    first_budget = max(0.05 * model.retrieval_mean_s, model.retrieval_mean_s - sum(gaps) / len(counts))
    scale = first_budget / (sum(first) / len(first))
    times: list[list[float]] = []
    it = iter(gaps)
    for n, f in zip(counts, first, strict=True):
        t = [f * scale]
        for _ in range(n - 1):
            t.append(t[-1] + next(it))
        times.append(t)
    return times


def _pick_rows(rng: random.Random, pool_size: int, count: int, first: int | None = None) -> list[int]:
    """`count` distinct rows (as far as the pool allows), starting with `first` when given."""
    rows = [first] if first is not None else []
    others = [r for r in rng.sample(range(pool_size), min(pool_size, count + 1)) if r != first]
    rows += others[:count - len(rows)]
    while len(rows) < count:                              # a tiny pool: reuse rows
        rows.append(rng.randrange(pool_size))
    return rows


def _unique(docs: list[TraceDocument]) -> list[TraceDocument]:
    seen: set[str] = set()
    out = []
    for doc in docs:
        doc_id, n = doc.id, 2
        while doc_id in seen:
            doc_id, n = f"{doc.id}-{n}", n + 1
        seen.add(doc_id)
        out.append(doc if doc_id == doc.id else replace(doc, id=doc_id))
    return out


def anns_stage_lists(rng: random.Random, k: int, stages: int) -> tuple[list[list[int]], int]:
    """The top-k lists of each stage as labels (0..k-1 the true ranks, k.. impostors by score).

    Built backwards from the true list: a step back either removes a found document (a tail-
    biased but possibly front position) and lets the best unused impostor in at the tail, or
    swaps two neighbours (other than the pair just swapped). Forwards, each update inserts a
    document at its rank or fixes an order, so consecutive lists always differ. Returns the
    lists and the impostors used.
    """
    floor = max(1, round(0.3 * k))
    lists = [list(range(k))]
    impostors, last_swap = 0, -1
    for _ in range(stages - 1):
        current = list(lists[-1])
        true_positions = [i for i, label in enumerate(current) if label < k]
        if (len(true_positions) > floor and rng.random() < 0.8) or k == 1:
            if k == 1 and len(true_positions) == 0:
                current[0] = k + impostors
                impostors += 1
            else:
                j = rng.choices(true_positions, weights=[i + 1 for i in true_positions])[0]
                del current[j]
                current.append(k + impostors)
                impostors += 1
            last_swap = -1
        else:                                         # a swap, never one that undoes the step before
            weights = [0 if i == last_swap else i + 1 for i in range(k - 1)]
            j = rng.choices(range(k - 1), weights=weights if any(weights) else None)[0]
            current[j], current[j + 1] = current[j + 1], current[j]
            last_swap = j
        lists.append(current)
    lists.reverse()
    return lists, impostors


def _stage_info(lists: list[list[int]], k: int) -> list[TraceStage]:
    n = len(lists)
    return [TraceStage(index=s, search_list_size=max(k, round(10_000 / 2 ** (n - 1 - s))),
                       recall_at_k=round(sum(1 for label in labels if label < k) / k, 3))
            for s, labels in enumerate(lists)]


def synthesize(params: SynthParams, pool: PassagePool) -> list[TraceQuery]:
    """The trace's queries, deterministic in `params` and the pool."""
    params.check()
    model = MODELS[params.workload]
    rng = random.Random(f"trace-synth:{params.workload}:{params.seed}")
    mu, below, above = fit_split_lognormal(*model.tokens)
    totals = [lognormal_quantile(u, mu, below, above) * params.token_scale
              for u in stratified_uniforms(rng, params.queries)]
    counts = [model.chunks(u) for u in stratified_uniforms(rng, params.queries)]
    times = _times(model, rng, counts)
    cap = params.max_prompt_tokens or math.inf
    queries = []
    for i, (target, n, t_real) in enumerate(zip(totals, counts, times, strict=True)):
        docs_in_context = n if model.mode == "append" else params.top_k
        total = int(max(docs_in_context * MIN_DOC_TOKENS, min(cap, round(target))))
        t_s = [round(t * params.time_scale, 6) for t in t_real]
        topic = rng.randrange(len(pool))
        question = pool.question(topic, rng)
        qid = f"{params.workload}-{i + 1:05d}"
        meta: dict[str, Any] = {"target_tokens": total, "capped": target > cap}
        if model.mode == "append":
            chunks = _crawler_chunks_for(rng, pool, total, n, topic, t_s)
        else:
            chunks = _anns_chunks_for(rng, pool, total, n, topic, t_s, params.top_k)
        queries.append(TraceQuery(qid, question, params.workload, "synthesized", tuple(chunks), meta))
    return queries


def _crawler_chunks_for(rng: random.Random, pool: PassagePool, total: int, n: int, topic: int,
                        t_s: list[float]) -> list[TraceChunk]:
    sizes = split_tokens(total, [rng.gammavariate(2.0, 1.0) for _ in range(n)], MIN_DOC_TOKENS)
    rows = _pick_rows(rng, len(pool), n, first=topic)
    docs = _unique([pool.document(row, size) for row, size in zip(rows, sizes, strict=True)])
    return [TraceChunk(t, "append", j == n - 1, (replace(doc, score=round(1.0 - 0.05 * j, 4)),))
            for j, (t, doc) in enumerate(zip(t_s, docs, strict=True))]


def _anns_chunks_for(rng: random.Random, pool: PassagePool, total: int, n: int, topic: int,
                     t_s: list[float], k: int) -> list[TraceChunk]:
    lists, impostor_count = anns_stage_lists(rng, k, n)
    sizes = split_tokens(total, [rng.gammavariate(2.0, 1.0) for _ in range(k)], MIN_DOC_TOKENS)
    # Impostors are no longer than the documents they stand in for, so no list outgrows the final one.
    impostor_sizes = [max(MIN_DOC_TOKENS, round(min(sizes) * rng.uniform(0.6, 1.0))) for _ in range(impostor_count)]
    window = [(topic + d) % len(pool) for d in range(-3 * k, 3 * k + 1)] if len(pool) > 6 * k else []
    true_rows = [topic] + (rng.sample([r for r in window if r != topic], k - 1) if window
                           else _pick_rows(rng, len(pool), k, first=topic)[1:])
    impostor_rows = _pick_rows(rng, len(pool), impostor_count)
    top = round(rng.uniform(0.85, 0.95), 4)
    docs = [pool.document(r, s) for r, s in zip(true_rows, sizes, strict=True)]
    docs = [replace(d, score=round(top - 0.02 * i, 4)) for i, d in enumerate(docs)]
    low = docs[-1].score
    docs += [replace(pool.document(r, s), score=round(low - 0.02 * (i + 1), 4))
             for i, (r, s) in enumerate(zip(impostor_rows, impostor_sizes, strict=True))]
    docs = _unique(docs)
    stages = _stage_info(lists, k)
    return [TraceChunk(t, "update", s == n - 1, tuple(docs[label] for label in labels), stages[s])
            for s, (t, labels) in enumerate(zip(t_s, lists, strict=True))]


def build_header(params: SynthParams, counter: TokenCounter, passages: str, corpus: str) -> TraceHeader:
    """The trace's header: the parameters, the tokenizer, the passage store and the calibration used."""
    model = MODELS[params.workload]
    meta = {
        "workload": params.workload, "mode": model.mode, "seed": params.seed, "queries": params.queries,
        "token_scale": params.token_scale, "time_scale": params.time_scale,
        "max_prompt_tokens": params.max_prompt_tokens, "tokenizer": counter.name,
        "passages": passages, "corpus": corpus,
        "calibration": {"source": CALIBRATION_SOURCE, "published": PUBLISHED[params.workload],
                        "targets": scaled_targets(params.workload, params.token_scale, params.time_scale),
                        "model": model.describe()},
    }
    if model.mode == "update":
        meta["top_k"] = params.top_k
    return TraceHeader(time_scale=params.time_scale, generator=GENERATOR, meta=meta)
