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

Fall-back: if the transfer call fails, the request is decoded here and the answer does not change
(a KV_TRANSFER_FALLBACK event records why). Before the decode replica sent a token it finishes as
any colocated request does (after the hand-off the whole prompt is submitted again, the prefix cache
holding most of it). Once tokens were relayed, as on the native backend (`disagg/sender.py`), the
prompt and those tokens are submitted as one new request that decodes the rest (`_resume`): its
tokens are relayed after the relayed ones, and the answer covers both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from inference_svc.engine.engine import lcp_length
from inference_svc.engine.events import EventKind
from inference_svc.engine.kv_export import KvLayout
from inference_svc.engine.request import FinishReason, RequestStats, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.decode_targets import DecodeTargets
from inference_svc.kv_transfer.transfer_call import TransferCall, TransferFailed, tokens_per_message
from inference_svc.kv_transfer.wire import finish_reason
from inference_svc.rpc.summary import RequestSummary
from inference_svc.vllm_backend.kv_spool import SHIP_KEY, KvSpool
from inference_svc.vllm_backend.servicer import VllmServicer
from inference_svc.vllm_backend.session import VllmRequest, vllm_params
from protos import kv_transfer_pb2_grpc

log = logging.getLogger(__name__)


class HandOffRequest(VllmRequest):
    def __init__(self, *args, target: str, stub: kv_transfer_pb2_grpc.KvTransferStub, layout: KvLayout,
                 spool: KvSpool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.target = target
        self.layout = layout
        self.spool = spool
        # The KvTransfer call; the decode side "holds" a chunk's KV (in memory, until finish).
        self.call = TransferCall(self.request_id, target, stub, self.sampling, self.events,
                                 lambda: self.stats.last_input_time, ack_word="held")
        self.shipped_ids: list[int] = []          # prompt tokens whose KV the decode replica holds (sent)
        self._ship_dir: str | None = None
        self._finish_segments: list[Segment] | None = None
        self.handed_off = False
        self.fallen_back = False
        self._tasks: list[asyncio.Task] = []

    # --- caller input ---------------------------------------------------------------------
    def open(self, segments, arrived_at: float) -> None:
        self.call.outbox.put_nowait(("begin", self.layout))
        super().open(segments, arrived_at)        # bad input raises here, before any transfer call
        self._tasks.append(asyncio.create_task(self._transfer(), name=f"kv-transfer-{self.request_id}"))

    def finish(self, segments, arrived_at: float) -> None:
        if self.fallen_back:
            return super().finish(segments, arrived_at)
        self.prompt.finish(segments)
        self._finish_segments = list(segments)
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
        if self.fallen_back or self.handed_off:
            return None
        # A resubmission: the decode replica keeps only what both prompts share.
        valid = lcp_length(self.shipped_ids, self.prompt.tokens)
        if valid < len(self.shipped_ids):
            self.shipped_ids = self.shipped_ids[:valid]
            self.call.outbox.put_nowait(("truncate", valid))
        if self._ship_dir is not None:
            self.spool.drop_ship_dir(self._ship_dir)
        self._ship_dir = self.spool.new_ship_dir()
        return {SHIP_KEY: {"dir": self._ship_dir, "from": len(self.shipped_ids)}}

    def _after_turn(self) -> None:
        if self.fallen_back or self.handed_off:
            return
        self._ship()
        self._maybe_hand_off()

    def _ship(self) -> None:
        """What the connector wrote since the last turn, as `blocks` messages of at most 16 MiB."""
        bs = self.layout.block_size
        per_message = tokens_per_message(self.layout)
        for shipment in self.spool.take_shipments(self._ship_dir) if self._ship_dir else []:
            for first in range(0, len(shipment.token_ids), per_message):
                token_ids = shipment.token_ids[first:first + per_message]
                kv = shipment.data[:, :, first // bs:-(-(first + len(token_ids)) // bs)]
                self.call.outbox.put_nowait(("blocks", shipment.start + first, token_ids, kv))
            self.shipped_ids = self.shipped_ids[:shipment.start] + list(shipment.token_ids)

    def _maybe_hand_off(self) -> None:
        """Once the whole prompt is submitted, prefilled and shipped: `finish`, and end the session here."""
        if (self.handed_off or self.fallen_back or self._finish_segments is None or self._inputs is None
                or self._turns_done != self._turns_sent or self._submitted != len(self.prompt.tokens)):
            return
        self._ship()
        if self.shipped_ids != self.prompt.tokens:
            self._fail_over(f"the prefill side shipped {len(self.shipped_ids)} of {len(self.prompt.tokens)} "
                            "prompt tokens")
            return
        self.handed_off = True
        self.call.outbox.put_nowait(("finish", None))    # timed from when it is sent
        self._stop_incarnation()          # aborts the session: its blocks return to the pool
        self.spool.drop_ship_dir(self._ship_dir)
        self._ship_dir = None

    # --- the transfer call --------------------------------------------------------------------
    async def _transfer(self) -> None:
        try:
            done = await self.call.run()
        except TransferFailed as exc:
            self._fail_over(exc.reason)
            return
        self._done(done, time.monotonic())

    def _done(self, done, now: float) -> None:
        remote = done.stats
        stats: RequestStats = dataclasses.replace(
            self.stats, finish_time=now, first_token_time=self.call.first_token_at or self.stats.first_token_time,
            tokens_computed=len(self.prompt.tokens) - self.stats.prefix_cache_hit_tokens + remote.tokens_computed,
            prefix_cache_hit_tokens=self.stats.prefix_cache_hit_tokens + remote.prefix_cache_hit_tokens,
            preemptions_recompute=self.stats.preemptions_recompute + remote.preemptions_recompute)
        self.finished = True
        summary = RequestSummary(self.request_id, finish_reason(done.finish_reason), stats,
                                 len(self.prompt.tokens), tuple(self.call.relayed), done.text)
        self.on_end(summary)
        self.events.put_nowait(summary)

    def _fail_over(self, reason: str) -> None:
        if self.finished or self.fallen_back:
            return
        self.fallen_back = True
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        log.warning("%s: KV transfer to %s failed (%s); decoding here", self.request_id, self.target, reason)
        self._emit(EventKind.KV_TRANSFER_FALLBACK, detail=f"decode replica {self.target}: {reason}; decoding here")
        if self._ship_dir is not None:
            self.spool.drop_ship_dir(self._ship_dir)
            self._ship_dir = None
        if self.handed_off and self.call.relayed:
            self._resume(list(self.call.relayed))
        elif self._finish_segments is not None:    # finish already arrived: finish here, as a colocated request
            super().finish(self._finish_segments, self.stats.last_input_time)

    def _resume(self, relayed: list[int]) -> None:
        """Decode the rest of an answer the decode replica started: the prompt and the relayed tokens
        as one plain submission (the prefix cache holds the prompt's full blocks) for the tokens still
        allowed. The relayed tokens count as this request's output, so the summary covers the whole
        answer, no second FIRST_TOKEN is emitted, and the text streams on from where the decode
        replica's stopped (its deltas follow the same `OutputText` rules over the same tokens)."""
        self.output = relayed
        self.output_text.add(relayed)
        self.output_text.take()
        self.stats.first_token_time = self.call.first_token_at
        max_tokens = min(self.sampling.max_tokens, self.prompt.limits.max_sequence_tokens - len(self.prompt.tokens))
        remaining = max_tokens - len(relayed)
        if remaining <= 0:                 # every token arrived: only the decode replica's `done` was lost
            self._end(FinishReason.LENGTH)
            return
        self._final_turn = 0
        self._launch(self._plain(self.prompt.tokens + relayed, vllm_params(self.sampling, remaining)),
                     len(self.prompt.tokens))


class VllmDisaggServicer(DecodeTargets, VllmServicer):
    """`VllmServicer` that hands off a StreamPrompt call naming a decode replica, and reports its role
    (`role`, `receiver`, `channel_factory`: `DecodeTargets`)."""

    def __init__(self, *args, layout: KvLayout, spool: KvSpool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.layout = layout
        self.spool = spool

    async def _hand_off(self, request_id: str, target: str, segments: list[Segment], sampling: SamplingParams,
                        priority: int, arrived: float, events: asyncio.Queue) -> None:
        request = HandOffRequest(self.llm, request_id, self.new_prompt(), sampling, events, self.decode, arrived,
                                 self.stats.request_ended, target=target, stub=self._stub(target),
                                 layout=self.layout, spool=self.spool)
        try:
            request.open(segments, arrived)
        except Exception:
            request.close()
            raise
        self._requests[request_id] = request
        self.stats.request_received()

    def _engine_stats(self):
        stats = super()._engine_stats()
        stats.role = self.role
        return stats
