"""The prefill side of a hand-off, one state machine for both backends (native
`disagg/sender.HandOff`, vLLM `vllm_backend/handoff.HandOffRequest`): what goes to the decode
replica and when it takes over, and what happens when the transfer fails (the fall-back and the
resume). How KV is computed and exported, and how a request is decoded here, stay with each backend
(the hooks below).

States: shipping (each prefilled chunk's KV goes out as `blocks`; a prompt change that cuts into
what was shipped sends `truncate`) → finishing (`finish` arrived: the tail is prefilled and shipped)
→ handed off (`finish` sent: the decode replica decodes, its events are the caller's) → finished (its
`done` arrived). A transfer that fails before `done` is a fall-back (a KV_TRANSFER_FALLBACK event
says why), and the answer does not change:
- while shipping: nothing more is shipped; `finish`, when it comes, decodes here as on a colocated
  replica (the backend's `finish` sees `fallen_back`);
- while finishing: the request decodes here at once (`_finish_here`);
- handed off: the tokens the decode replica sent begin the answer. If they are all the answer may
  have, or the last is a stop token, only its `done` was lost and the request ends (`_end_relayed`,
  with the reason); otherwise `_resume` decodes the rest here from the prompt and those tokens (the
  one continuation rule: `servicekit/continuation.py`).

The backend hooks:
- `_put(message)`: queue a message (`transfer_call`'s tuples) for the call; by default at once, on
  the event loop.
- `_last_input()`: when the caller's last input arrived (the hand-off event's timing).
- `_emit(kind, *, count=0, detail="")`: an event of the caller's request (not written here: on
  vLLM it is `VllmRequest`'s own).
- `_answer(done)`: the decode replica's `InferenceDone`, made the caller's summary.
- `_on_fall_back()`: stop what ships (on the event loop, as the fall-back starts).
- `_at_fall_back(decide)`: run `decide` where the shipping state is consistent (native: on the
  engine thread, which ships and hands off); by default at once.
- `_finish_here()`, `_resume(relayed, remaining)`, `_end_relayed(relayed, reason)`: the ways of
  decoding here, named above (`reason`: `continuation.LENGTH` or `STOP`).
- `_max_output_tokens()`: how many tokens the answer may have (by default the sampling's).
- `_stop_token_ids()`: the token ids that end the answer (by default the sampling's; a backend adds
  the model's end-of-sequence ids).

A mixin: it sets its state after the class it is listed before (`super().__init__`), and needs
`request_id`, `sampling`, `events` (the caller's queue) and `layout` (the KV layout, before the
first shipment). Neither the native engine nor vllm is imported here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from inference_svc.engine.engine import lcp_length
from inference_svc.engine.events import EventKind
from inference_svc.kv_transfer.transfer_call import TransferCall, TransferFailed, tokens_per_message
from protos import inference_pb2, kv_transfer_pb2_grpc
from servicekit.continuation import Continuation, continue_after

log = logging.getLogger(__name__)


class PrefillHandOff:
    def __init__(self, *args, target: str, stub: kv_transfer_pb2_grpc.KvTransferStub, priority: int = 0,
                 ack_word: str = "imported", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.target = target
        # ack_word: what the decode side did with a chunk ("imported", "held")
        self.call = TransferCall(self.request_id, target, stub, self.sampling, self.events, self._last_input,
                                 priority=priority, ack_word=ack_word)
        self.shipped_ids: list[int] = []     # prompt tokens whose KV went to the decode replica
        self.finishing = False               # finish arrived: ship the tail, then hand off
        self.handed_off = False              # finish sent: the decode replica decodes
        self.fallen_back = False             # the transfer failed: decoded here
        self.finished = False                # the caller's request ended

    @property
    def shipping(self) -> bool:
        """Whether KV still goes to the decode replica (neither handed off nor fallen back)."""
        return not (self.handed_off or self.fallen_back)

    # --- what is shipped ----------------------------------------------------------------------
    def _truncate(self, prompt_ids: list[int], computed: int | None = None) -> None:
        """The prompt changed: both sides keep only the tokens the shipped ones share with it (and
        that are still computed here); `truncate` goes out when that cuts into what was shipped."""
        valid = lcp_length(self.shipped_ids, prompt_ids)
        if computed is not None:
            valid = min(valid, computed)
        if self.shipping and valid < len(self.shipped_ids):
            self.shipped_ids = self.shipped_ids[:valid]
            self._put(("truncate", valid))

    def _ship(self, start: int, token_ids: list[int], export: Callable[[int, int], torch.Tensor]) -> None:
        """The KV of `token_ids`, the prompt's tokens from `start` (a block boundary), as `blocks`
        messages of whole blocks, at most `transfer_call.MAX_MESSAGE_BYTES` each; `export(first,
        end)` is the KV of the prompt's tokens first..end. The decode replica then holds the
        shipped tokens before `start` and these."""
        step = tokens_per_message(self.layout)
        end = start + len(token_ids)
        for first in range(start, end, step):
            last = min(first + step, end)
            self._put(("blocks", first, token_ids[first - start:last - start], export(first, last)))
        self.shipped_ids = self.shipped_ids[:start] + list(token_ids)

    def _hand_off(self, kv_ready_at: float | None) -> None:
        """The whole prompt is shipped: `finish` goes out and the decode replica takes over.
        `kv_ready_at`: when the tail's KV was computed (`transfer_call`), or None."""
        self.handed_off = True
        self._put(("finish", kv_ready_at))

    # --- the transfer call and the fall-back ----------------------------------------------------
    async def _transfer(self) -> None:
        """The call, from `begin` to the decode replica's `done`; a failure falls back."""
        try:
            done = await self.call.run()
        except TransferFailed as exc:
            self._fail_over(exc.reason)
            return
        self.finished = True
        self._answer(done)

    def _fail_over(self, reason: str) -> None:
        """The transfer failed (`reason`): decode here, with the same answer."""
        if self.finished or self.fallen_back:
            return
        self.fallen_back = True
        self._on_fall_back()
        log.warning("%s: KV transfer to %s failed (%s); decoding here", self.request_id, self.target, reason)
        self._emit(EventKind.KV_TRANSFER_FALLBACK, detail=f"decode replica {self.target}: {reason}; decoding here")
        rest = self._continuation()
        if rest.nothing_left:                    # every token arrived: only the decode replica's `done` was lost
            self._end_relayed(list(rest.delivered), rest.ended)
            return
        self._at_fall_back(self._decode_here)

    def _continuation(self) -> Continuation:
        """The rest of the answer after the tokens the decode replica relayed (servicekit/continuation.py)."""
        return continue_after(self.call.relayed, self._max_output_tokens(), self._stop_token_ids())

    def _decode_here(self) -> None:
        """The fall-back's choice, made where the shipping state is consistent (`_at_fall_back`)."""
        if self.handed_off:
            rest = self._continuation()
            self._resume(list(rest.delivered), rest.max_tokens)
        elif self.finishing:
            self._finish_here()
        # else `finish`, when it arrives, decodes here

    # --- the backend hooks ----------------------------------------------------------------------
    def _put(self, message: tuple) -> None:
        self.call.outbox.put_nowait(message)

    def _last_input(self) -> float:
        raise NotImplementedError

    def _answer(self, done: inference_pb2.InferenceDone) -> None:
        raise NotImplementedError

    def _on_fall_back(self) -> None:
        """Stop what ships (nothing by default)."""

    def _at_fall_back(self, decide: Callable[[], None]) -> None:
        decide()

    def _finish_here(self) -> None:
        raise NotImplementedError

    def _resume(self, relayed: list[int], remaining: int) -> None:
        raise NotImplementedError

    def _end_relayed(self, relayed: list[int], reason: str) -> None:
        raise NotImplementedError

    def _max_output_tokens(self) -> int:
        return self.sampling.max_tokens

    def _stop_token_ids(self) -> tuple[int, ...]:
        return tuple(self.sampling.stop_token_ids)
