"""The prefill side of a KV transfer on vLLM: a StreamPrompt call whose metadata names a decode
replica (`DECODE_TARGET_KEY`, what the orchestrator's pairing sends) is prefilled here and decoded
there, over the same `KvTransfer.Transfer` call as the native engine's (`protos/kv_transfer.proto`).

`HandOffRequest` is a `VllmRequest` whose submissions carry our connector's `SHIP_KEY`
(`kv_connector.py`): while the context streams in, each turn of the streaming-input session is
prefilled as on a colocated replica, and when the turn ends its KV (already in the spool, written by
the connector after the forward pass) goes out as `blocks` messages. An update that resubmits sends
`truncate` to what both sides still agree on, and the new submission ships from there (the prefix
cache serves those blocks, and they are shipped from the cache too). `finish` sends the suffix as
one more prefill-only turn; once its KV is shipped, `finish` goes to the decode replica and the
session here ends (its blocks return to the pool, the full ones stay in the prefix cache). The
decode replica's events come back on the transfer call and are the caller's events.

What is shipped when, the hand-off and the fall-back are the state machine of
`kv_transfer/handoff.PrefillHandOff` (the same on the native engine); this module is how vLLM feeds
it. Decoding here after a fall-back: before the decode replica sent a token the request finishes as
any colocated request does (after the hand-off the whole prompt is submitted again, the prefix cache
holding most of it); once tokens were relayed, the prompt and those tokens are submitted as one new
request that decodes the rest (`_resume`): its tokens are relayed after the relayed ones, and the
answer covers both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from inference_svc.engine.kv_export import KvLayout
from inference_svc.engine.request import FinishReason, RequestStats, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.decode_targets import DecodeTargets
from inference_svc.kv_transfer.handoff import PrefillHandOff
from inference_svc.kv_transfer.wire import finish_reason
from inference_svc.rpc.summary import RequestSummary
from inference_svc.vllm_backend.kv_spool import SHIP_KEY, KvSpool
from inference_svc.vllm_backend.servicer import VllmServicer
from inference_svc.vllm_backend.session import VllmRequest, vllm_params
from protos import kv_transfer_pb2_grpc
from servicekit.continuation import STOP


class HandOffRequest(PrefillHandOff, VllmRequest):
    def __init__(self, *args, target: str, stub: kv_transfer_pb2_grpc.KvTransferStub, layout: KvLayout,
                 spool: KvSpool, eos_token_ids: tuple[int, ...] = (), **kwargs) -> None:
        # The decode side "holds" a chunk's KV (in memory, until finish).
        super().__init__(*args, target=target, stub=stub, ack_word="held", **kwargs)
        self.layout = layout
        self.spool = spool
        self.eos_token_ids = eos_token_ids       # the model's: a relayed one ends the answer (`_stop_token_ids`)
        self._ship_dir: str | None = None
        self._finish_segments: list[Segment] | None = None
        self._tasks: list[asyncio.Task] = []

    # --- caller input ---------------------------------------------------------------------
    def open(self, segments, arrived_at: float) -> None:
        self._put(("begin", self.layout))
        super().open(segments, arrived_at)        # bad input raises here, before any transfer call
        self._tasks.append(asyncio.create_task(self._transfer(), name=f"kv-transfer-{self.request_id}"))

    def finish(self, segments, arrived_at: float) -> None:
        if self.fallen_back:
            return super().finish(segments, arrived_at)
        self.prompt.finish(segments)
        self._finish_segments = list(segments)
        self.finishing = True
        self._arrived(arrived_at)
        # The suffix (and anything held back) as one more prefill-only turn; hand off when it is shipped.
        self._submit_up_to(len(self.prompt.tokens), wait=False)
        self._maybe_hand_off()

    def close(self) -> None:
        super().close()
        for task in self._tasks:
            task.cancel()
        if self._ship_dir is not None:
            self.spool.drop_ship_dir(self._ship_dir)

    # --- the connector's side of each submission and turn ----------------------------------
    def _kv_params(self) -> dict | None:
        if not self.shipping:
            return None
        self._truncate(self.prompt.tokens)        # a resubmission: the decode replica keeps what both prompts share
        if self._ship_dir is not None:
            self.spool.drop_ship_dir(self._ship_dir)
        self._ship_dir = self.spool.new_ship_dir()
        return {SHIP_KEY: {"dir": self._ship_dir, "from": len(self.shipped_ids)}}

    def _after_turn(self) -> None:
        if not self.shipping:
            return
        self._ship_turns()
        self._maybe_hand_off()

    def _ship_turns(self) -> None:
        """What the connector wrote since the last turn."""
        bs = self.layout.block_size
        for shipment in self.spool.take_shipments(self._ship_dir) if self._ship_dir else []:
            # its data's first block starts at shipment.start
            self._ship(shipment.start, shipment.token_ids, lambda first, end, s=shipment: s.data[
                :, :, (first - s.start) // bs:-(-(end - s.start) // bs)])

    def _maybe_hand_off(self) -> None:
        """Once the whole prompt is submitted, prefilled and shipped: `finish`, and end the session here."""
        if (not self.shipping or self._finish_segments is None or self._inputs is None
                or self._turns_done != self._turns_sent or self._submitted != len(self.prompt.tokens)):
            return
        self._ship_turns()
        if self.shipped_ids != self.prompt.tokens:
            self._fail_over(f"the prefill side shipped {len(self.shipped_ids)} of {len(self.prompt.tokens)} "
                            "prompt tokens")
            return
        self._hand_off(None)              # timed from when `finish` is sent
        self._stop_incarnation()          # aborts the session: its blocks return to the pool
        self.spool.drop_ship_dir(self._ship_dir)
        self._ship_dir = None

    # --- the hand-off's hooks -------------------------------------------------------------------
    def _last_input(self) -> float:
        return self.stats.last_input_time

    def _answer(self, done) -> None:
        remote = done.stats
        stats: RequestStats = dataclasses.replace(
            self.stats, finish_time=time.monotonic(),
            first_token_time=self.call.first_token_at or self.stats.first_token_time,
            tokens_computed=len(self.prompt.tokens) - self.stats.prefix_cache_hit_tokens + remote.tokens_computed,
            prefix_cache_hit_tokens=self.stats.prefix_cache_hit_tokens + remote.prefix_cache_hit_tokens,
            preemptions_recompute=self.stats.preemptions_recompute + remote.preemptions_recompute)
        summary = RequestSummary(self.request_id, finish_reason(done.finish_reason), stats,
                                 len(self.prompt.tokens), tuple(self.call.relayed), done.text)
        self.on_end(summary)
        self.events.put_nowait(summary)

    def _on_fall_back(self) -> None:
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self._ship_dir is not None:
            self.spool.drop_ship_dir(self._ship_dir)
            self._ship_dir = None

    def _max_output_tokens(self) -> int:
        return min(self.sampling.max_tokens, self.prompt.limits.max_sequence_tokens - len(self.prompt.tokens))

    def _stop_token_ids(self) -> tuple[int, ...]:
        return (*self.sampling.stop_token_ids, *(() if self.sampling.ignore_eos else self.eos_token_ids))

    def _finish_here(self) -> None:
        """Finish as a colocated request (the prefix cache holds what was submitted)."""
        super().finish(self._finish_segments, self.stats.last_input_time)

    def _end_relayed(self, relayed: list[int], reason: str) -> None:
        self._take_relayed(relayed)
        self._end(FinishReason.STOP if reason == STOP else FinishReason.LENGTH)

    def _resume(self, relayed: list[int], remaining: int) -> None:
        """Decode the rest of an answer the decode replica started (the continuation,
        servicekit/continuation.py): the prompt and the relayed tokens as one plain submission (the
        prefix cache holds the prompt's full blocks) for the `remaining` tokens. Nothing relayed: the
        same continuation, made by finishing as a colocated request."""
        if not relayed:
            self._finish_here()
            return
        self._take_relayed(relayed)
        self._final_turn = 0
        self._launch(self._plain(self.prompt.tokens + relayed, vllm_params(self.sampling, remaining)),
                     len(self.prompt.tokens))

    def _take_relayed(self, relayed: list[int]) -> None:
        """The relayed tokens count as this request's output, so the summary covers the whole answer,
        no second FIRST_TOKEN is emitted, and the text streams on from where the decode replica's
        stopped (its deltas follow the same `OutputText` rules over the same tokens)."""
        self.output = relayed
        self.output_text.add(relayed)
        self.output_text.take()
        self.stats.first_token_time = self.call.first_token_at


class VllmDisaggServicer(DecodeTargets, VllmServicer):
    """`VllmServicer` that hands off a StreamPrompt call naming a decode replica (`role`, `receiver`,
    `channel_factory`: `DecodeTargets`)."""

    def __init__(self, *args, layout: KvLayout, spool: KvSpool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.layout = layout
        self.spool = spool

    async def _hand_off(self, request_id: str, target: str, segments: list[Segment], sampling: SamplingParams,
                        priority: int, arrived: float, events: asyncio.Queue) -> None:
        request = HandOffRequest(self.llm, request_id, self.new_prompt(), sampling, events, self.decode, arrived,
                                 self.stats.request_ended, target=target, stub=self._stub(target),
                                 layout=self.layout, spool=self.spool,
                                 eos_token_ids=tuple(self.model_info.chat_format.eos_token_ids))
        try:
            request.open(segments, arrived)
        except Exception:
            request.close()
            raise
        self._requests[request_id] = request
        self.stats.request_received()
