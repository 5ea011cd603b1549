"""The prefill side's state machine both backends share (`kv_transfer/handoff.PrefillHandOff`), over
recording hooks: what is shipped, and what a failed transfer falls back to in each state. No engine,
no server: the pair tests (test_transfer.py, test_vllm_disagg.py) run it for real."""

from __future__ import annotations

import asyncio

from inference_svc.engine.events import EventKind
from inference_svc.engine.kv_export import KvLayout
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.handoff import PrefillHandOff
from inference_svc.kv_transfer.transfer_call import tokens_per_message

# A block of 32 MiB: each `blocks` message carries one block (4 tokens).
LAYOUT = KvLayout(num_layers=1, num_kv_heads=1, head_dim=1 << 20, block_size=4, dtype="float32")


class Recorded(PrefillHandOff):
    def __init__(self, max_tokens: int = 5) -> None:
        self.request_id = "r"
        self.sampling = SamplingParams(max_tokens=max_tokens)
        self.events: asyncio.Queue = asyncio.Queue()
        self.layout = LAYOUT
        super().__init__(target="decode:1", stub=None)
        self.sent: list[tuple] = []
        self.done: list[tuple] = []

    def _put(self, message: tuple) -> None:
        self.sent.append(message)

    def _last_input(self) -> float:
        return 0.0

    def _emit(self, kind, *, count=0, detail=""):
        self.events.put_nowait((kind, detail))

    def _answer(self, done) -> None:
        self.done.append(("answer", done))

    def _finish_here(self) -> None:
        self.done.append(("finish here",))

    def _resume(self, relayed, remaining) -> None:
        self.done.append(("resume", relayed, remaining))

    def _end_relayed(self, relayed, reason) -> None:
        self.done.append(("end", relayed, reason))


def kinds(handoff: Recorded) -> list[str]:
    return [message[0] for message in handoff.sent]


def test_a_chunk_goes_out_in_messages_of_whole_blocks_and_an_update_truncates_what_was_shipped():
    handoff = Recorded()
    assert tokens_per_message(LAYOUT) == 4
    tokens = list(range(10))
    handoff._ship(0, tokens, lambda first, end: f"kv {first}-{end}")
    assert handoff.sent == [("blocks", 0, [0, 1, 2, 3], "kv 0-4"), ("blocks", 4, [4, 5, 6, 7], "kv 4-8"),
                            ("blocks", 8, [8, 9], "kv 8-10")]
    handoff._ship(8, [8, 9, 10], lambda first, end: f"kv {first}-{end}")   # the last block again, filled further
    assert handoff.sent[-1] == ("blocks", 8, [8, 9, 10], "kv 8-11") and handoff.shipped_ids == list(range(11))
    handoff._truncate([0, 1, 2, 999], computed=10)
    assert handoff.sent[-1] == ("truncate", 3) and handoff.shipped_ids == [0, 1, 2]
    handoff._truncate([0, 1, 2, 5], computed=2)  # computed here caps what both sides keep
    assert handoff.sent[-1] == ("truncate", 2)
    handoff._truncate([0, 1, 7])                 # nothing shipped is cut: nothing sent
    assert kinds(handoff) == ["blocks"] * 4 + ["truncate"] * 2


def test_a_failure_while_shipping_waits_for_finish_and_ships_nothing_more():
    handoff = Recorded()
    handoff._fail_over("UNAVAILABLE: gone")
    assert handoff.fallen_back and not handoff.shipping and handoff.done == []
    kind, detail = handoff.events.get_nowait()
    assert kind is EventKind.KV_TRANSFER_FALLBACK and "decode replica decode:1: UNAVAILABLE: gone" in detail
    handoff._truncate([7])
    assert handoff.sent == []


def test_a_failure_while_finishing_decodes_here_at_once():
    handoff = Recorded()
    handoff.finishing = True
    handoff._fail_over("refused")
    assert handoff.done == [("finish here",)]


def test_a_failure_after_the_hand_off_resumes_from_the_relayed_tokens():
    handoff = Recorded(max_tokens=5)
    handoff.finishing = True
    handoff._hand_off(None)
    assert handoff.sent == [("finish", None)]
    handoff.call.relayed.extend([11, 12])
    handoff._fail_over("lost")
    assert handoff.done == [("resume", [11, 12], 3)]


def test_every_token_relayed_only_the_done_was_lost():
    handoff = Recorded(max_tokens=2)
    handoff.finishing = True
    handoff._hand_off(None)
    handoff.call.relayed.extend([11, 12])
    handoff._fail_over("lost")
    assert handoff.done == [("end", [11, 12], "length")]


def test_a_stop_token_relayed_last_ends_the_answer_with_stop():
    handoff = Recorded(max_tokens=5)
    handoff.sampling = SamplingParams(max_tokens=5, stop_token_ids=(12,))
    handoff.finishing = True
    handoff._hand_off(None)
    handoff.call.relayed.extend([11, 12])
    handoff._fail_over("lost")
    assert handoff.done == [("end", [11, 12], "stop")]


def test_a_request_that_ended_or_fell_back_does_not_fall_back_again():
    handoff = Recorded()
    handoff.finished = True
    handoff._fail_over("late")
    assert handoff.events.empty() and handoff.done == []
    again = Recorded()
    again.finishing = True
    again._fail_over("first")
    again._fail_over("second")
    assert again.done == [("finish here",)] and again.events.qsize() == 1
