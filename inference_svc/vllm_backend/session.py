"""One request on vLLM: appends through a streaming-input session, updates by resubmission.

A request runs as a sequence of vLLM submissions ("incarnations"):
- While the context grows, the incarnation is a streaming-input session
  (`AsyncLLM.generate` over an async generator of `StreamingInput`): a turn prefills new
  context and samples one token that vLLM discards before the next turn; the `finish` suffix
  is the final turn, sampled with the caller's parameters, and only its tokens are the answer.
  vLLM runs a session's turns one after another, each at least one engine step, so chunks
  appended while a turn runs are held and sent together as one turn when it ends (500
  one-token appends: a few turns, not 500 steps); `finish` takes whatever is held with it, an
  update sends it at once.
- An `update` that changes tokens already submitted aborts the incarnation and submits the
  new prompt as a new session; vLLM's prefix cache serves the common prefix (whole blocks).
  Unless it is the final refinement, only its stable prefix is submitted (the head and the leading
  segments not likely to be replaced: `SegmentTokenizer.stable_prefix_tokens`, the native engine's
  rule); the rest waits for the final stage, an append or `finish`.
- A complete prompt with nothing left to send as its own turn (Generate, or `finish` with an
  empty suffix after the context was submitted), or one sampled with a seed (`seeded`), is one
  plain submission.
Stop strings go to vLLM (`SamplingParams.stop`, which needs vLLM to detokenize) so that it
stops generating; the output text, and what of it may be streamed, come from the native
engine's `OutputText` over the token ids, so both backends cut the text the same way.
Events go to the caller's queue as the native engine's `EngineEvent`s and `RequestSummary`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from vllm import SamplingParams as VllmSamplingParams
from vllm.engine.protocol import StreamingInput
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.fair_share import NO_SHARE
from inference_svc.engine.output_text import OutputText
from inference_svc.engine.request import FinishReason, RequestStats
from inference_svc.engine.sampler import SamplingParams
from inference_svc.rpc.summary import RequestSummary
from inference_svc.vllm_backend.prompt import StreamedPrompt
from inference_svc.vllm_backend.ranking import share_marks, stream_marks

log = logging.getLogger(__name__)
FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
_END = object()   # closes a session's input generator after the final turn


def vllm_params(params: SamplingParams, max_tokens: int) -> VllmSamplingParams:
    """The caller's sampling on a complete prompt (the final turn, or a whole submission); marked
    complete for our scheduler class (ranking.py)."""
    return VllmSamplingParams(
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, seed=params.seed,
        max_tokens=max_tokens, stop_token_ids=list(params.stop_token_ids), ignore_eos=params.ignore_eos,
        stop=list(params.stop), output_kind=RequestOutputKind.DELTA, detokenize=bool(params.stop),
        extra_args=stream_marks(complete=True))


def intermediate_params() -> VllmSamplingParams:
    """A turn of a prompt still receiving context: one greedy token, discarded by vLLM; marked partial,
    with the chunk's arrival, for our scheduler class."""
    return VllmSamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.DELTA,
                              detokenize=False, extra_args=stream_marks(complete=False))


INTERMEDIATE = intermediate_params()


def seeded(params: SamplingParams) -> bool:
    """Whether vLLM gives the request its own seeded generator (`SamplingType.RANDOM_SEED`). vLLM's
    model runner creates that generator only when a request is first added; a streaming-input
    session's later turns replace its sampling parameters but keep the first turn's (greedy: none),
    so a seeded final turn would sample from the global generator. Such a request finishes as a
    plain submission instead, sampled exactly as `Generate` samples it."""
    return params.seed is not None and not params.greedy


class VllmRequest:
    def __init__(self, llm: AsyncLLM, request_id: str, prompt: StreamedPrompt, sampling: SamplingParams,
                 events: asyncio.Queue, decode: Callable[[list[int]], str],
                 arrived_at: float, on_end: Callable[[RequestSummary], None]) -> None:
        self.llm = llm
        self.request_id = request_id
        self.prompt = prompt
        self.sampling = sampling
        self.events = events
        self.decode = decode
        self.on_end = on_end
        self.stats = RequestStats(arrival_time=arrived_at, last_input_time=arrived_at)
        self.output: list[int] = []
        self.output_text = OutputText(decode, sampling.stop)
        self._incarnation = 0
        self._task: asyncio.Task | None = None
        self._inputs: asyncio.Queue | None = None   # chunks for the running session; None: not a session
        self._submitted = 0                        # prompt tokens sent to the current incarnation
        self._turns_sent = 0
        self._turns_done = 0                       # turns of the current incarnation vLLM has finished
        self._turn_ends: list[int] = []            # `_submitted` after each turn sent
        self._held_until = 0                       # prompt end asked for while a turn ran: the next turn ends there
        self._final_turn: int | None = None
        self.opened_wall = self.last_chunk_wall = time.time()   # the clock of the scheduler's marks
        self.share, self.priority = NO_SHARE, 0               # who it is for (the servicer sets them)
        self._scheduled = False
        self.finished = False

    # --- caller input (validated by `prompt`; raises before changing anything) ---------------
    def open(self, segments, arrived_at: float) -> None:
        head = self.prompt.open(segments)
        self._emit(EventKind.QUEUED)
        if head:
            self._start_session(head)

    def append(self, segments, arrived_at: float) -> None:
        self.prompt.append(segments)
        self.stats.num_appends += 1
        self._arrived(arrived_at)
        self._submit_up_to(len(self.prompt.tokens))

    def update(self, segments, arrived_at: float, final: bool = True) -> None:
        lcp = self.prompt.update(segments)
        self.stats.num_updates += 1
        self._arrived(arrived_at)
        ahead = len(self.prompt.tokens) if final else len(self.prompt.head) + self.prompt.stable_prefix_tokens(segments)
        if lcp < self._submitted:    # tokens vLLM has were replaced: resubmit, the prefix cache keeps the LCP
            self.stats.tokens_invalidated += self._submitted - lcp
            self._emit(EventKind.INVALIDATED, count=self._submitted - lcp)
            self._stop_incarnation()
        self._submit_up_to(ahead, wait=False)   # a refinement goes at once (only appends are coalesced)

    def finish(self, segments, arrived_at: float) -> None:
        self.prompt.finish(segments)
        self._arrived(arrived_at)
        max_tokens = min(self.sampling.max_tokens,
                         self.prompt.limits.max_sequence_tokens - len(self.prompt.tokens))
        final = vllm_params(self.sampling, max_tokens)
        rest = self.prompt.tokens[self._submitted:]   # the suffix, and context held back (an update, a running turn)
        if self._inputs is not None and rest and not seeded(self.sampling):
            self._final_turn = self._turns_sent
            self._inputs.put_nowait(StreamingInput(TokensPrompt(prompt_token_ids=rest), final))
            self._inputs.put_nowait(_END)
            self._turns_sent += 1
            self._submitted = len(self.prompt.tokens)
            self._turn_ends.append(self._submitted)
            return
        # Nothing submitted yet, nothing new to send as the last turn, or seeded sampling: one plain
        # submission of the whole prompt (what was submitted before is found in the prefix cache).
        self._stop_incarnation()
        self._final_turn = 0
        self._launch(self._plain(self.prompt.tokens, final), len(self.prompt.tokens))

    def close(self) -> None:
        """The call ended (any reason): stop the vLLM request; cancelling `generate` aborts it."""
        self._stop_incarnation()

    # --- memory pressure (pressure.py) ----------------------------------------------------------
    @property
    def submitted_tokens(self) -> int:
        return self._submitted

    @property
    def idle_session(self) -> bool:
        """A session between turns: every turn sent is done and more input is awaited; vLLM keeps its KV."""
        return (not self.finished and self._inputs is not None and self._final_turn is None
                and self._turns_done == self._turns_sent)

    @property
    def has_pending_work(self) -> bool:
        """Something submitted that vLLM has not finished: a turn, or a whole prompt."""
        return not self.finished and self._task is not None and not self.idle_session

    @property
    def pending_tokens(self) -> int:
        """Prompt tokens submitted after the last turn vLLM finished (all of them for a new submission)."""
        done = self._turn_ends[min(self._turns_done, len(self._turn_ends)) - 1] if self._turns_done else 0
        return self._submitted - done

    def evict(self) -> None:
        """Recompute eviction of an idle session: end its vLLM request (the blocks return to the pool,
        hashed for the prefix cache); the next input submits the prompt again."""
        self._stop_incarnation()
        self.stats.preemptions_recompute += 1
        self._emit(EventKind.PREEMPTED_RECOMPUTE)

    # --- incarnations -------------------------------------------------------------------------
    def _start_session(self, first: list[int]) -> None:
        self._inputs = asyncio.Queue()
        params = self._with_kv_params(intermediate_params())
        self._inputs.put_nowait(StreamingInput(TokensPrompt(prompt_token_ids=list(first)), params))
        self._turns_sent = 1
        self._final_turn = None
        self._launch(self._session(self._inputs, params), len(first))

    def _submit_up_to(self, end: int, wait: bool = True) -> None:
        """Send the prompt's tokens up to `end` that vLLM does not have yet: a new session, or the
        next turn of the running one. With `wait`, while a turn runs they are held for the next one
        (`_send_held`); an update sends its turn at once, behind the running one, as before."""
        if self._inputs is None:
            if end > self._submitted:
                self._start_session(self.prompt.tokens[:end])
            return
        self._held_until = end            # the latest input says how far ahead to go (an update may say less)
        if not wait or self._turns_done == self._turns_sent:
            self._send_held()

    def _send_held(self) -> None:
        """The held tokens as one turn."""
        if self._inputs is None or self._final_turn is not None or self._held_until <= self._submitted:
            return
        tokens = self.prompt.tokens[self._submitted:self._held_until]
        self._inputs.put_nowait(StreamingInput(TokensPrompt(prompt_token_ids=tokens), intermediate_params()))
        self._turns_sent += 1
        self._submitted = self._held_until
        self._turn_ends.append(self._submitted)

    def _launch(self, outputs: AsyncIterator, submitted: int) -> None:
        self._incarnation += 1
        self._submitted = submitted
        self._turns_done = 0
        self._turn_ends = [submitted]
        self._task = asyncio.create_task(self._consume(self._incarnation, outputs),
                                         name=f"vllm-{self.request_id}-{self._incarnation}")

    def _stop_incarnation(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        self._inputs = None
        self._submitted = 0
        self._held_until = 0

    def _vllm_id(self) -> str:
        return f"{self.request_id}#{self._incarnation + 1}"

    def _session(self, inputs: asyncio.Queue, first: VllmSamplingParams = INTERMEDIATE) -> AsyncIterator:
        async def chunks():
            while (item := await inputs.get()) is not _END:
                yield item

        return self.llm.generate(chunks(), first, self._vllm_id())

    def _plain(self, tokens: list[int], params: VllmSamplingParams) -> AsyncIterator:
        return self.llm.generate(TokensPrompt(prompt_token_ids=list(tokens)), self._with_kv_params(params),
                                 self._vllm_id())

    # --- disaggregation (handoff.py, kv_receiver.py) ------------------------------------------
    def _kv_params(self) -> dict | None:
        """`kv_transfer_params` for our KV connector on a new submission (None: not touched)."""
        return None

    def _with_kv_params(self, params: VllmSamplingParams) -> VllmSamplingParams:
        """A new submission's parameters with who it is for (fair share, ranking.py) and our KV connector's."""
        params.extra_args = {**(params.extra_args or {}), **share_marks(self.share.tenant, self.share.weight,
                                                                        self.priority)}
        kv = self._kv_params()
        if kv is not None:
            params.extra_args = {**(params.extra_args or {}), "kv_transfer_params": kv}
        return params

    def _after_turn(self) -> None:
        """A turn of the current incarnation ended (its KV is computed)."""

    async def _consume(self, incarnation: int, outputs: AsyncIterator) -> None:
        turn = 0
        try:
            async with contextlib.aclosing(outputs):
                async for out in outputs:
                    completion = out.outputs[0]
                    if not self._scheduled:
                        self._scheduled = True
                        self._emit(EventKind.SCHEDULED)
                    self.stats.prefix_cache_hit_tokens = max(self.stats.prefix_cache_hit_tokens,
                                                             out.num_cached_tokens or 0)
                    if turn == self._final_turn and self._accept(list(completion.token_ids),
                                                                 completion.finish_reason is not None):
                        self._end(FinishReason.STOP)   # a stop string; leaving closes the vLLM request
                        return
                    if completion.finish_reason is not None:
                        if turn == self._final_turn:
                            self._end(FINISH_REASONS.get(completion.finish_reason, FinishReason.STOP))
                            return
                        turn += 1
                        if incarnation == self._incarnation:
                            self._turns_done = turn
                            self._send_held()     # what arrived during the turn, as the next one
                            self._after_turn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # vLLM rejected the input or failed: end the call with its message
            log.warning("vLLM request %s failed: %s", self.request_id, exc)
            if incarnation == self._incarnation and not self.finished:
                self.events.put_nowait(exc)

    # --- events ---------------------------------------------------------------------------------
    def _accept(self, token_ids: list[int], finishing: bool) -> bool:
        """Emit the new tokens; True when a stop string appeared (the rest is dropped).
        `finishing`: vLLM ends the request after these tokens."""
        for i, token in enumerate(token_ids):
            if not self.output:
                self.stats.first_token_time = time.monotonic()
                self._emit(EventKind.FIRST_TOKEN)
            self.output.append(token)
            # As in the native engine: a stop token's own text is not part of the output.
            stopped = token not in self.sampling.stop_token_ids and self.output_text.add(self.output)
            last = stopped or (finishing and i == len(token_ids) - 1)
            self._emit(EventKind.TOKEN, token_id=token, text=self.output_text.take(final=last))
            if stopped:
                return True
        return False

    def _end(self, reason: FinishReason) -> None:
        self.finished = True
        self.stats.finish_time = time.monotonic()
        self.stats.tokens_computed = len(self.prompt.tokens) - self.stats.prefix_cache_hit_tokens + len(self.output)
        self._emit(EventKind.FINISHED, detail=reason.value)
        summary = RequestSummary(self.request_id, reason, self.stats, len(self.prompt.tokens), tuple(self.output),
                                 self.output_text.final)
        self.on_end(summary)
        self.events.put_nowait(summary)

    def _arrived(self, arrived_at: float) -> None:
        self.stats.last_input_time = arrived_at
        self.last_chunk_wall = time.time()

    def _emit(self, kind: EventKind, *, count: int = 0, token_id: int | None = None, text: str = "",
              detail: str = "") -> None:
        self.events.put_nowait(EngineEvent(self.request_id, kind, time.monotonic(), count, token_id, text, detail))
