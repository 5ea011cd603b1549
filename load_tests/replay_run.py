"""One replay run against an Inference service: the prompts a trace query becomes, and its requests.

- streaming: at the query's first chunk a `StreamPrompt` is opened with the head (the
  query), then every chunk is sent at its `t_s` as an `append` (its documents) or an `update`
  (the complete document list), and `finish` (the suffix) right after the last chunk;
- non-streaming: one `Generate` with the whole final prompt (head + final documents +
  suffix) at the time the last chunk would have arrived.

Queries arrive as a Poisson process at the QPS (seeded; the same arrivals for both modes).
A document becomes one segment keyed by its id. TTFT is the paper's: first token minus the
arrival of the query's last chunk (its scheduled time). `load_tests.replay` runs this per
configuration (`streamrag bench replay`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from retriever_svc.replay.trace import TraceDocument, TraceQuery
from retriever_svc.stability import stability_hints

START_DELAY_S = 0.2          # first arrival after the run starts (lets every task get scheduled)


# --- the prompt -------------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptBuilder:
    """Segments of a replayed prompt: head (the query), one segment per document, suffix.

    `session` is written right after the chat prefix, so two runs never share prefix-cache
    blocks beyond the chat prefix; every session string has the same length.
    """

    prompt_prefix: str = ""
    user_prefix: str = ""
    user_suffix: str = ""
    assistant_prefix: str = ""
    session: str = ""
    stability_hints: bool = True        # updates carry the retriever's hints (retriever_svc.stability)

    @classmethod
    def from_chat(cls, chat: Any, session: str, stability_hints: bool = True) -> PromptBuilder:
        return cls(chat.prompt_prefix, chat.user_prefix, chat.user_suffix, chat.assistant_prefix, session,
                   stability_hints)

    def head(self, query: str) -> list[Any]:
        from protos import common_pb2

        tag = f"[session {self.session}] " if self.session else ""
        return [common_pb2.Segment(text=f"{self.prompt_prefix}{self.user_prefix}{tag}{query}\n\n")]

    def document(self, doc: TraceDocument) -> Any:
        from protos import common_pb2

        return common_pb2.Segment(text=doc.text + "\n", key=doc.id)

    def suffix(self) -> list[Any]:
        from protos import common_pb2

        return [common_pb2.Segment(text=self.user_suffix + self.assistant_prefix)]


def final_documents(query: TraceQuery) -> list[TraceDocument]:
    """The context after every chunk: appends extend it, an update replaces it."""
    docs: list[TraceDocument] = []
    for chunk in query.chunks:
        docs = list(chunk.documents) if chunk.mode == "update" else docs + list(chunk.documents)
    return docs


def stable_query(query: TraceQuery) -> TraceQuery:
    """The query with each update's documents in the orchestrator's order (`stable_order`):
    survivors stay where they were, new documents follow. Both paths replay this same query."""
    from dataclasses import replace

    from orchestrator.documents import stable_order

    chunks, previous = [], []
    for chunk in query.chunks:
        if chunk.mode == "update":
            chunk = replace(chunk, documents=tuple(stable_order([d.id for d in previous], chunk.documents)))
            previous = list(chunk.documents)
        chunks.append(chunk)
    return replace(query, chunks=tuple(chunks))


def scale_query(query: TraceQuery, delay_multiplier: float) -> TraceQuery:
    """Stretch the gaps between a query's chunks by `delay_multiplier` (the first chunk keeps its time).

    Longer gaps keep each streamed prompt resident longer, which is how the paper creates
    memory pressure (section 6.4); the time before the first chunk holds no KV, so it stays.
    """
    if delay_multiplier == 1.0 or not query.chunks:
        return query
    from dataclasses import replace

    first = query.chunks[0].t_s
    return replace(query, chunks=tuple(replace(c, t_s=first + (c.t_s - first) * delay_multiplier)
                                       for c in query.chunks))


def poisson_arrivals(n: int, qps: float, seed: int) -> list[float]:
    """`n` arrival offsets (s) of a Poisson process at `qps`; the first at 0."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(qps)
        out.append(t)
    return out


# --- one request ------------------------------------------------------------------------------

@dataclass
class RequestRecord:
    query_id: str
    workload: str
    streaming: bool
    arrival_s: float                       # run-relative times (s)
    last_chunk_s: float                    # when the last chunk arrives (scheduled)
    chunks: int = 0
    first_token_s: float | None = None
    done_s: float | None = None
    ttft_s: float | None = None            # first token - last chunk (the paper's TTFT)
    ttft_from_arrival_s: float | None = None
    server_ttft_s: float | None = None     # the service's own ttft_from_last_chunk_s
    prompt_tokens: int = 0
    tokens_computed: int = 0
    blend_reused_tokens: int = 0           # of tokens_computed, those whose KV came from the chunk store (blend)
    tokens_invalidated: int = 0
    preemptions_swap: int = 0
    preemptions_recompute: int = 0
    generated_tokens: int = 0
    send_lag_s: float = 0.0                # worst lateness of a message against its schedule
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class _Clock:
    def __init__(self, t0: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.t0 = t0
        self.t0_wall = time.time() + (t0 - self.loop.time())     # the run's zero in wall time (step logs)

    def now(self) -> float:
        return self.loop.time() - self.t0

    async def until(self, t: float, record: RequestRecord) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)
        record.send_lag_s = max(record.send_lag_s, self.now() - t)


async def _read_events(call: Any, record: RequestRecord, clock: _Clock) -> None:
    import grpc

    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            break
        event = response.event
        kind = event.WhichOneof("kind")
        if kind == "token" and record.first_token_s is None:
            record.first_token_s = clock.now()
        elif kind == "done":
            record.done_s = clock.now()
            stats = event.done.stats
            record.server_ttft_s = stats.ttft_from_last_chunk_s
            record.prompt_tokens = stats.prompt_tokens
            record.tokens_computed = stats.tokens_computed
            record.blend_reused_tokens = stats.blend_reused_tokens
            record.tokens_invalidated = stats.tokens_invalidated
            record.preemptions_swap = stats.preemptions_swap
            record.preemptions_recompute = stats.preemptions_recompute
            record.generated_tokens = stats.generated_tokens
            if record.first_token_s is None:
                record.error = f"ended without a token: {event.done.finish_detail or event.done.finish_reason}"


def _sampling(output_tokens: int) -> Any:
    from protos import common_pb2

    return common_pb2.SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)


async def _streaming_request(stub: Any, query: TraceQuery, record: RequestRecord, clock: _Clock,
                             builder: PromptBuilder, request_id: str, output_tokens: int, timeout_s: float) -> None:
    from protos import inference_pb2

    def message(**kind: Any) -> inference_pb2.StreamPromptRequest:
        return inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(**kind))

    await clock.until(record.arrival_s + query.chunks[0].t_s, record)
    call = stub.StreamPrompt(timeout=timeout_s)
    reader = asyncio.create_task(_read_events(call, record, clock))
    try:
        await call.write(message(open=inference_pb2.PromptOpen(
            request_id=request_id, sampling=_sampling(output_tokens), segments=builder.head(query.query))))
        previous_update: list[str] | None = None
        for chunk in query.chunks:
            await clock.until(record.arrival_s + chunk.t_s, record)
            segments = [builder.document(d) for d in chunk.documents]
            if chunk.mode == "update":
                if builder.stability_hints:     # what the ANNS retriever sends with this refinement
                    ids = [d.id for d in chunk.documents]
                    for segment, hint in zip(segments, stability_hints(previous_update, ids, chunk.final), strict=True):
                        if hint is not None:
                            segment.stability = hint
                    previous_update = ids
                final = chunk.final or not builder.stability_hints
                await call.write(message(update=inference_pb2.PromptReplace(segments=segments, final_stage=final)))
            elif segments:                      # an empty append is only an end marker
                await call.write(message(append=inference_pb2.PromptAppend(segments=segments)))
        await call.write(message(finish=inference_pb2.PromptFinish(segments=builder.suffix())))
        await call.done_writing()
    except Exception:
        await reader                            # the server ended the call: its status says why
        raise
    await reader


async def _generate_request(stub: Any, query: TraceQuery, record: RequestRecord, clock: _Clock,
                            builder: PromptBuilder, request_id: str, output_tokens: int, timeout_s: float) -> None:
    from protos import inference_pb2

    await clock.until(record.last_chunk_s, record)
    segments = builder.head(query.query) + [builder.document(d) for d in final_documents(query)] + builder.suffix()
    call = stub.Generate(inference_pb2.GenerateRequest(request_id=request_id, segments=segments,
                                                       sampling=_sampling(output_tokens)), timeout=timeout_s)
    await _read_events(call, record, clock)


async def _one(stub: Any, query: TraceQuery, record: RequestRecord, clock: _Clock, builder: PromptBuilder,
               request_id: str, output_tokens: int, timeout_s: float) -> None:
    import grpc

    send = _streaming_request if record.streaming else _generate_request
    try:
        await send(stub, query, record, clock, builder, request_id, output_tokens, timeout_s)
    except grpc.aio.AioRpcError as exc:
        record.error = f"{exc.code().name}: {exc.details()}"
    except Exception as exc:                   # one bad request must not end the run
        record.error = f"{type(exc).__name__}: {exc}"
    if record.error is None and record.first_token_s is None:
        record.error = "no token received"
    if record.first_token_s is not None:
        record.ttft_s = record.first_token_s - record.last_chunk_s
        record.ttft_from_arrival_s = record.first_token_s - record.arrival_s


@dataclass
class RunResult:
    streaming: bool
    qps: float
    records: list[RequestRecord] = field(default_factory=list)
    trace_completion_s: float = 0.0
    start_wall_s: float = 0.0           # the run's zero (arrival_s 0) in wall time (time.time())


async def replay_run(stub: Any, queries: Sequence[TraceQuery], *, streaming: bool, qps: float, seed: int,
                     builder: PromptBuilder, output_tokens: int = 1, timeout_s: float = 600.0,
                     label: str = "", progress: Callable[[str], None] | None = None) -> RunResult:
    """Replay `queries` once (streaming or not) with Poisson arrivals; every query is its own task."""
    arrivals = poisson_arrivals(len(queries), qps, seed)
    clock = _Clock(asyncio.get_running_loop().time() + START_DELAY_S)
    mode = "s" if streaming else "ns"
    records = [RequestRecord(q.query_id, q.workload, streaming, a, a + q.duration_s, len(q.chunks))
               for q, a in zip(queries, arrivals, strict=True)]
    done = 0
    step = max(1, len(queries) // 10)

    async def task(query: TraceQuery, record: RequestRecord) -> None:
        nonlocal done
        await _one(stub, query, record, clock, builder, f"{builder.session}-{mode}-{query.query_id}",
                   output_tokens, timeout_s)
        done += 1
        if progress and (done % step == 0 or done == len(queries)):
            progress(f"{label}: {done}/{len(queries)} requests done at t={clock.now():.1f}s")

    await asyncio.gather(*(task(q, r) for q, r in zip(queries, records, strict=True)))
    ends = [r.done_s if r.done_s is not None else r.first_token_s for r in records]
    completion = max((e for e in ends if e is not None), default=math.nan)
    return RunResult(streaming, qps, records, completion, clock.t0_wall)
