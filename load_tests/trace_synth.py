"""`streamrag trace synth`: synthetic retrieval traces calibrated to the Stream2LLM workloads.

    streamrag trace synth --workload crawler|anns --out traces/crawler.jsonl \\
        [--queries 200] [--token-scale 0.1] [--time-scale 1] [--seed 0] [--passages FILE]

The Stream2LLM paper (section 6.1, appendix A.1) replays two recorded retriever traces that
we do not have: a crawl4ai web crawl streaming pages in `append` mode, and a DiskANN search
with AquaPipe-style early results streaming refined top-k lists in `update` mode. This
module draws traces whose statistics match the figures the paper publishes
(shared/workloads/stream2llm_published_stats.json, copied into `PUBLISHED`) and fills them
with real text from our passage store, so the token counts are real tokens.

The model, per workload (every draw is seeded; token totals, chunk counts, gaps and first-
chunk times are stratified draws, one per quantile slice, so even 50 queries hit the targets):

- tokens per query: a lognormal with separate spreads below and above the median, fitted
  exactly to the published mean, p50 and p95;
- chunks per query: crawler a rounded lognormal around 8 (unimodal, mostly 6 to 10);
  ANNS 1 + a geometric count (right-skewed, more than half the queries get at most 3);
- timing: time to the first chunk, then inter-chunk gaps, both lognormal. The gaps' median
  is the published one; the first-chunk times are scaled so the mean total retrieval time
  (the final chunk's `t_s`) is the published mean;
- crawler: each chunk appends one new page (a run of consecutive passages of our corpus,
  cut to its token share), so the context grows chunk by chunk;
- ANNS: each chunk is an `update` with the complete top-k list. The final list is the true
  top-k; earlier lists lack some of its documents (held by lower-scored impostors) or rank
  two of them the wrong way round, and each update inserts a found document at its rank or
  fixes an order, at any position, front included. Everything from that position on is
  invalidated (hence more than 10,000 tokens for some queries at paper scale).

Scaling: `--token-scale` multiplies the token targets and `--max-prompt-tokens` caps a
query's context (default: the embedded model's 8192 tokens less 1024 for the head,
question, suffix and output); `--time-scale` multiplies every time (gaps and retrieval
time) and is written to the header's `time_scale`. Tokens are counted with the embedded
model's tokenizer (`--tokenizer embedded`, the default) or, faster, with words and
punctuation marks times 1.211, the ratio measured against that tokenizer over the whole
python-3.11-docs store (per passage within about 10%; `--tokenizer approx`).

The argparse wiring (`add_trace_synth_args`, `run_trace_synth`) imports nothing heavy.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any, Protocol

from retriever_svc.trace import TraceChunk, TraceDocument, TraceHeader, TraceQuery, TraceStage, write_trace

GENERATOR = "streamrag trace synth"
WORKLOADS = ("crawler", "anns")
CALIBRATION_SOURCE = "shared/workloads/stream2llm_published_stats.json"
EMBEDDED_CONTEXT_TOKENS = 8192
PROMPT_MARGIN_TOKENS = 1024          # chat head, instructions, question, suffix and the answer
DEFAULT_MAX_PROMPT_TOKENS = EMBEDDED_CONTEXT_TOKENS - PROMPT_MARGIN_TOKENS
MIN_DOC_TOKENS = 8
INVALIDATION_THRESHOLD = 10_000      # tokens, at paper scale (appendix A.1)
APPROX_TOKENS_PER_WORD = 1.211       # SmolLM2 tokens / approx words over python-3.11-docs

# The published figures used here (Llama-3.1 tokens), from CALIBRATION_SOURCE.
PUBLISHED: dict[str, dict[str, Any]] = {
    "crawler": {
        "queries": 4322,
        "tokens_per_query": {"mean": 9100, "p50": 5800, "p95": 28900},
        "retrieval_latency_s": {"mean": 9.9},
        "inter_chunk_arrival_ms": {"median": 700.7,
                                   "range_note": "tens of ms to over 30 s, about three orders of magnitude"},
        "chunks_per_query": {"shape": "roughly unimodal, concentrated around 6-10"},
    },
    "anns": {
        "queries": 500,
        "tokens_per_query": {"mean": 13000, "p50": 10000, "p95": 31000},
        "retrieval_latency_s": {"mean": 4.5},
        "inter_chunk_arrival_ms": {"median": 36.7, "range_note": "bulk between 1 and 1000 ms"},
        "chunks_per_query": {"shape": "right-skewed, more than 50% of queries get at most 3 chunks"},
        "tokens_invalidated": {"note": "more than 10% of requests invalidate over 10,000 tokens at every load level"},
    },
}
_Z95 = NormalDist().inv_cdf(0.95)


# --- token counting ---------------------------------------------------------------------------

class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...

    def cut(self, text: str, tokens: int) -> str:
        """The longest prefix of `text` with at most `tokens` tokens (cut at a token boundary)."""
        ...


class EmbeddedTokenCounter:
    """Exact counts with the embedded model's tokenizer (no special tokens)."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tokenizer, self.name = tokenizer, name

    @classmethod
    def load(cls, model_dir: Path | None = None) -> EmbeddedTokenCounter:
        from transformers import AutoTokenizer

        from inference_svc.embedded_model import MODEL_NAME, embedded_model_dir

        path = Path(model_dir) if model_dir is not None else embedded_model_dir()
        if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
            raise FileNotFoundError(f"no tokenizer in {path}: prepare the embedded model first, "
                                    "or use --tokenizer approx")
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokenizer.model_max_length = sys.maxsize         # we count documents, not model inputs: no length warning
        return cls(tokenizer, f"{MODEL_NAME} tokenizer")

    def count(self, text: str) -> int:
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def cut(self, text: str, tokens: int) -> str:
        encoded = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if len(encoded["input_ids"]) <= tokens:
            return text
        return text[:encoded["offset_mapping"][tokens - 1][1]] if tokens > 0 else ""


class ApproxTokenCounter:
    """Words and punctuation marks times a ratio calibrated to the embedded model's tokenizer."""

    _WORD = re.compile(r"\w+|[^\w\s]")

    def __init__(self, tokens_per_word: float = APPROX_TOKENS_PER_WORD) -> None:
        self.ratio = tokens_per_word
        self.name = f"approx ({tokens_per_word} x words and punctuation, calibrated to SmolLM2-135M-Instruct)"

    def count(self, text: str) -> int:
        return round(len(self._WORD.findall(text)) * self.ratio)

    def cut(self, text: str, tokens: int) -> str:
        keep = math.floor(tokens / self.ratio)
        if keep <= 0:
            return ""
        for i, match in enumerate(self._WORD.finditer(text)):
            if i == keep - 1:
                return text[:match.end()]
        return text


# --- the passages documents are cut from ------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class PassagePool:
    """The store's passages in row order (pages stay together); documents are runs of them."""

    def __init__(self, passages: Sequence[Any], counter: TokenCounter) -> None:
        if not passages:
            raise ValueError("the passage store is empty")
        self.passages, self.counter = list(passages), counter
        self._tokens: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.passages)

    def tokens(self, row: int) -> int:
        if row not in self._tokens:
            self._tokens[row] = self.counter.count(self.passages[row].text)
        return self._tokens[row]

    def document(self, start: int, tokens: int) -> TraceDocument:
        """Consecutive passages from `start` (wrapping), joined and cut to `tokens` tokens."""
        texts: list[str] = []
        have, row = 0, start % len(self)
        for _ in range(len(self)):
            texts.append(self.passages[row].text)
            have += self.tokens(row)
            row = (row + 1) % len(self)
            if have >= tokens:
                break
        text = self.counter.cut("\n\n".join(texts), tokens).strip() or texts[0]
        first = self.passages[start % len(self)]
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
        return TraceDocument(id=f"{first.id}#{digest}", title=first.title.split(" — ")[0], url=first.url, text=text)

    def question(self, row: int, rng: random.Random) -> str:
        """A prose sentence (6 to 30 words) of the passage at `row`, else its title."""
        passage = self.passages[row]
        sentences = [s for s in _SENTENCE_END.split(" ".join(passage.text.split())) if 6 <= len(s.split()) <= 30]
        return rng.choice(sentences) if sentences else (passage.title or passage.text[:80] or passage.id)


# --- calibrated distributions -----------------------------------------------------------------

def fit_split_lognormal(mean: float, p50: float, p95: float) -> tuple[float, float, float]:
    """(mu, sigma_below, sigma_above): a lognormal with its own spread on each side of the median.

    The median is p50, the spread above it puts the p95 at p95, and the spread below it makes
    the mean `mean`: mean / p50 = exp(sb^2/2) Phi(-sb) + exp(sa^2/2) Phi(sa), where the first
    term falls from 1/2 to 0 as sb grows (solved by bisection; sb = 0 when the mean is too high).
    """
    phi = NormalDist().cdf
    above = math.log(p95 / p50) / _Z95
    need = mean / p50 - math.exp(above ** 2 / 2) * phi(above)

    def below_term(sigma: float) -> float:
        return math.exp(sigma ** 2 / 2) * phi(-sigma)

    if need >= 0.5:
        return math.log(p50), 0.0, above
    low, high = 0.0, 10.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if below_term(mid) > need else (low, mid)
    return math.log(p50), (low + high) / 2, above


def stratified_uniforms(rng: random.Random, n: int) -> list[float]:
    """One uniform in each of the n slices of (0, 1), shuffled."""
    values = [min(max((i + rng.random()) / n, 1e-12), 1 - 1e-12) for i in range(n)]
    rng.shuffle(values)
    return values


def lognormal_quantile(u: float, mu: float, sigma: float, sigma_above: float | None = None) -> float:
    """The u-quantile of a lognormal; `sigma_above` (if given) is the spread above the median."""
    z = NormalDist().inv_cdf(u)
    return math.exp(mu + (sigma if z < 0 or sigma_above is None else sigma_above) * z)


def _crawler_chunks(u: float) -> int:
    return min(20, max(2, round(lognormal_quantile(u, math.log(8.0), 0.3))))


_ANNS_GEOMETRIC_P = 0.234            # P(n <= 3) = 1 - (1 - p)^3 = 0.55


def _anns_chunks(u: float) -> int:
    return min(16, 1 + math.floor(math.log(1 - u) / math.log(1 - _ANNS_GEOMETRIC_P)))


@dataclass(frozen=True)
class WorkloadModel:
    name: str
    mode: str                        # "append" | "update"
    tokens: tuple[float, float, float]
    retrieval_mean_s: float
    gap_median_s: float
    gap_sigma: float
    first_sigma: float
    chunks: Callable[[float], int]   # quantile function: u in (0, 1) -> chunks per query
    chunks_note: str

    def describe(self) -> dict[str, Any]:
        mu, below, above = fit_split_lognormal(*self.tokens)
        return {"tokens_per_query": f"split lognormal(median {math.exp(mu):.0f}, sigma {below:.3f} below "
                                    f"and {above:.3f} above it)",
                "chunks_per_query": self.chunks_note,
                "inter_chunk_gap_s": f"lognormal(median {self.gap_median_s}, sigma {self.gap_sigma})",
                "first_chunk_s": f"lognormal(sigma {self.first_sigma}), scaled so the mean retrieval time "
                                 f"is {self.retrieval_mean_s} s"}


MODELS = {
    "crawler": WorkloadModel(
        "crawler", "append", (9100, 5800, 28900), 9.9, 0.7007, 1.0, 0.8, _crawler_chunks,
        "round(lognormal(median 8, sigma 0.3)) within [2, 20], one page per chunk"),
    "anns": WorkloadModel(
        "anns", "update", (13000, 10000, 31000), 4.5, 0.0367, 1.4, 0.5, _anns_chunks,
        f"1 + geometric(p {_ANNS_GEOMETRIC_P}) within [1, 16], each the full top-k list"),
}


def scaled_targets(workload: str, token_scale: float, time_scale: float) -> dict[str, float]:
    """The published figures at the requested scales (what the synthesized trace aims at)."""
    pub = PUBLISHED[workload]
    tokens = pub["tokens_per_query"]
    return {"tokens_mean": tokens["mean"] * token_scale, "tokens_p50": tokens["p50"] * token_scale,
            "tokens_p95": tokens["p95"] * token_scale,
            "gap_median_ms": pub["inter_chunk_arrival_ms"]["median"] * time_scale,
            "retrieval_mean_s": pub["retrieval_latency_s"]["mean"] * time_scale,
            "invalidation_threshold_tokens": INVALIDATION_THRESHOLD * token_scale}


# --- synthesis --------------------------------------------------------------------------------

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


# --- statistics -------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default); q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


class DocTokens:
    """A document's token count, cached by id and text (a document repeats along an update stream)."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._cache: dict[tuple[str, str], int] = {}

    def __call__(self, doc: TraceDocument) -> int:
        key = (doc.id, doc.text)
        if key not in self._cache:
            self._cache[key] = self.counter.count(doc.text)
        return self._cache[key]


@dataclass(frozen=True)
class QueryMeasure:
    tokens: int               # document tokens of the final context
    invalidated: int          # summed over updates, from the first changed document on (upper bound)
    updates: int              # updates that changed the list
    nontail_updates: int      # ... of which the first change is before the list's last document


def measure_query(query: TraceQuery, tokens: Callable[[TraceDocument], int]) -> QueryMeasure:
    context: list[TraceDocument] = []
    lost = updates = nontail = 0
    for chunk in query.chunks:
        if chunk.mode == "append":
            context = context + list(chunk.documents)
            continue
        new = list(chunk.documents)
        if context:
            j = next((i for i, (a, b) in enumerate(zip(context, new, strict=False)) if a.id != b.id),
                     min(len(context), len(new)))
            if j < len(context) or len(new) != len(context):
                updates += 1
                nontail += j < len(context) - 1
            lost += sum(tokens(d) for d in context[j:])
        context = new
    return QueryMeasure(sum(tokens(d) for d in context), lost, updates, nontail)


def trace_statistics(queries: Sequence[TraceQuery], tokens: Callable[[TraceDocument], int],
                     invalidation_threshold: float = INVALIDATION_THRESHOLD) -> dict[str, float]:
    """The statistics the paper publishes, measured on any trace's queries.

    Tokens per query are the document texts' tokens in the final context. Tokens invalidated
    are per query, summed over updates: from the first document that differs from the
    previous list to its end (an upper bound: the engine loses only what it had computed).
    """
    measures = [measure_query(q, tokens) for q in queries]
    per_query = [m.tokens for m in measures]
    invalidated = [m.invalidated for m in measures]
    chunk_counts = [len(q.chunks) for q in queries]
    firsts = [q.chunks[0].t_s for q in queries]
    totals = [q.chunks[-1].t_s for q in queries]
    gaps = [b.t_s - a.t_s for q in queries for a, b in zip(q.chunks, q.chunks[1:], strict=False)]
    updates = sum(m.updates for m in measures)
    return {
        "queries": len(queries),
        "tokens_mean": _mean(per_query), "tokens_p50": percentile(per_query, 50),
        "tokens_p95": percentile(per_query, 95), "tokens_max": max(per_query),
        "chunks_mean": _mean(chunk_counts), "chunks_p50": percentile(chunk_counts, 50),
        "chunks_min": min(chunk_counts), "chunks_max": max(chunk_counts),
        "chunks_share_6_10": _mean([6 <= n <= 10 for n in chunk_counts]),
        "chunks_share_le3": _mean([n <= 3 for n in chunk_counts]),
        "gap_median_ms": percentile(gaps, 50) * 1000, "gap_p1_ms": percentile(gaps, 1) * 1000,
        "gap_p99_ms": percentile(gaps, 99) * 1000, "gap_max_ms": max(gaps, default=math.nan) * 1000,
        "gap_share_1_1000ms": _mean([0.001 <= g <= 1.0 for g in gaps]),
        "first_chunk_mean_s": _mean(firsts), "retrieval_mean_s": _mean(totals),
        "retrieval_p95_s": percentile(totals, 95),
        "invalidated_mean": _mean(invalidated), "invalidated_p90": percentile(invalidated, 90),
        "invalidated_share_over": _mean([x > invalidation_threshold for x in invalidated]),
        "updates": updates,
        "updates_nontail_share": sum(m.nontail_updates for m in measures) / updates if updates else math.nan,
    }


def _num(value: float, digits: int = 0) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return f"{value:.{digits}f}" if digits else f"{round(value)}"


def statistics_table(workload: str, stats: dict[str, float], token_scale: float, time_scale: float,
                     capped: int = 0) -> str:
    """Rows of (metric, published, target at these scales, synthesized) as aligned text."""
    pub = PUBLISHED[workload]
    target = scaled_targets(workload, token_scale, time_scale)
    tok = pub["tokens_per_query"]
    gap = pub["inter_chunk_arrival_ms"]
    rows = [
        ("queries", str(pub["queries"]), "-", _num(stats["queries"])),
        ("tokens/query mean", str(tok["mean"]), _num(target["tokens_mean"]), _num(stats["tokens_mean"])),
        ("tokens/query p50", str(tok["p50"]), _num(target["tokens_p50"]), _num(stats["tokens_p50"])),
        ("tokens/query p95", str(tok["p95"]), _num(target["tokens_p95"]), _num(stats["tokens_p95"])),
        ("tokens/query max", "-", "-", _num(stats["tokens_max"]) + (f" ({capped} capped)" if capped else "")),
    ]
    if workload == "crawler":
        rows.append(("chunks/query", "unimodal, around 6-10", "6-10",
                     f"{stats['chunks_share_6_10']:.0%} in 6-10, mean {stats['chunks_mean']:.1f}, "
                     f"{_num(stats['chunks_min'])}-{_num(stats['chunks_max'])}"))
    else:
        rows.append(("chunks/query", ">50% get <= 3", ">50% <= 3",
                     f"{stats['chunks_share_le3']:.0%} <= 3, mean {stats['chunks_mean']:.1f}, "
                     f"{_num(stats['chunks_min'])}-{_num(stats['chunks_max'])}"))
    rows += [
        ("inter-chunk gap median (ms)", str(gap["median"]), _num(target["gap_median_ms"], 1),
         _num(stats["gap_median_ms"], 1)),
        ("inter-chunk gap spread (ms)", gap["range_note"].split(",")[0], "-",
         f"p1 {_num(stats['gap_p1_ms'], 1)}, p99 {_num(stats['gap_p99_ms'], 0)}, max {_num(stats['gap_max_ms'], 0)}"
         + (f"; {stats['gap_share_1_1000ms']:.0%} in 1-1000" if workload == "anns" else "")),
        ("retrieval time mean (s)", str(pub["retrieval_latency_s"]["mean"]), _num(target["retrieval_mean_s"], 2),
         _num(stats["retrieval_mean_s"], 2)),
        ("first chunk mean (s)", "-", "-", _num(stats["first_chunk_mean_s"], 2)),
    ]
    if workload == "anns":
        threshold = target["invalidation_threshold_tokens"]
        rows += [
            (f"queries invalidating > {_num(threshold)} tokens", "> 10000: >10% (engine)", ">10%",
             f"{stats['invalidated_share_over']:.0%} (upper bound)"),
            ("tokens invalidated/query mean, p90", "-", "-",
             f"{_num(stats['invalidated_mean'])}, {_num(stats['invalidated_p90'])} (upper bound)"),
            ("updates changing a non-tail document", "-", "-",
             f"{stats['updates_nontail_share']:.0%} of {_num(stats['updates'])}"),
        ]
    header = ("metric", "published", f"target (x{token_scale:g} tokens, x{time_scale:g} time)", "synthesized")
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
             for r in [header, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def build_header(params: SynthParams, counter: TokenCounter, passages: str, corpus: str) -> TraceHeader:
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


# --- command line -----------------------------------------------------------------------------

def add_trace_synth_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", required=True, choices=WORKLOADS,
                        help="crawler (append, pages streamed as crawled) or anns (update, refined top-k lists)")
    parser.add_argument("--out", required=True, type=Path, help="trace file to write (JSON lines)")
    parser.add_argument("--queries", type=int, default=200, help="number of queries (default: 200)")
    parser.add_argument("--token-scale", type=float, default=0.1,
                        help="multiplies the published token counts (default: 0.1, for the embedded model "
                             "on a CPU; 1 is paper scale, with --max-prompt-tokens 0 for a long-context engine)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiplies every time: gaps and retrieval time (default: 1, paper timing)")
    parser.add_argument("--max-prompt-tokens", type=int, default=DEFAULT_MAX_PROMPT_TOKENS,
                        help=f"cap on a query's document tokens (default: {DEFAULT_MAX_PROMPT_TOKENS}, the embedded "
                             f"model's {EMBEDDED_CONTEXT_TOKENS} less {PROMPT_MARGIN_TOKENS} for head, suffix and "
                             "output; 0: no cap; at paper scale for Llama-3.1 use e.g. 120000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--top-k", type=int, default=10, help="documents per ANNS list (default: 10)")
    parser.add_argument("--passages", type=Path, default=None,
                        help="passage store to take text from (default: <cache>/index/python-3.11-docs/"
                             "passages.sqlite)")
    parser.add_argument("--tokenizer", choices=("embedded", "approx"), default="embedded",
                        help="count tokens with the embedded model's tokenizer (default) or a calibrated "
                             "words-and-punctuation approximation (faster, no model needed)")


def _say_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_trace_synth(args: argparse.Namespace) -> int:
    """Entry point for `streamrag trace synth`: 0 written, 2 bad arguments or missing inputs."""
    from retriever_svc.corpus.store import PassageStore

    params = SynthParams(args.workload, args.queries, args.token_scale, args.time_scale, args.seed,
                         args.top_k, args.max_prompt_tokens)
    try:
        params.check()
        if args.passages is not None:
            passages_path = Path(args.passages)
        else:
            from retriever_svc.corpus.index import STORE, default_index_dir

            passages_path = default_index_dir() / STORE
        store = PassageStore(passages_path)
        try:
            passages, corpus = store.all(), store.meta().get("corpus", "")
        finally:
            store.close()
        counter: TokenCounter = EmbeddedTokenCounter.load() if args.tokenizer == "embedded" else ApproxTokenCounter()
        pool = PassagePool(passages, counter)
    except (OSError, ValueError, ImportError) as exc:
        _say_stderr(f"error: {exc}")
        return 2
    queries = synthesize(params, pool)
    tokens = DocTokens(counter)
    stats = trace_statistics(queries, tokens, INVALIDATION_THRESHOLD * params.token_scale)
    queries = [replace(q, meta={**q.meta, "tokens": m.tokens, "tokens_invalidated_upper_bound": m.invalidated})
               if params.workload == "anns" else replace(q, meta={**q.meta, "tokens": m.tokens})
               for q, m in ((q, measure_query(q, tokens)) for q in queries)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_trace(args.out, queries, build_header(params, counter, str(passages_path), corpus))
    capped = sum(1 for q in queries if q.meta.get("capped"))
    print(f"{params.workload} trace: {len(queries)} queries, seed {params.seed}, tokens by {counter.name}")
    print(statistics_table(params.workload, stats, params.token_scale, params.time_scale, capped))
    _say_stderr(f"wrote {len(queries)} queries to {args.out}")
    return 0

