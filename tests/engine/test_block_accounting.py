"""Property test: random open/append/update/finish/abort/preempt/step sequences never lose,
double-own or leak a KV block, and every answer still equals the reference answer. Requests in
blend mode fill and reuse the chunk store (chunk_store.py), whose blocks count in the same
accounting (the fake runner's "KV" is token ids, so a reused passage must still give the answer)."""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from inference_svc.engine.engine import PromptTooLongError
from inference_svc.engine.events import EventKind
from inference_svc.engine.request import FinishReason, RequestState, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.scheduler import SchedulerOutput
from tests.engine.engine_helpers import expected_output, fake_engine

DOC_TEXTS = ["alpha beta ", "gamma delta epsilon ", "zeta ", "eta theta iota kappa ", "lambda mu nu xi "]
docs = st.lists(st.sampled_from(range(len(DOC_TEXTS))), min_size=1, max_size=3).map(
    lambda ids: [Segment(text=DOC_TEXTS[i], key=f"doc{i}") for i in ids])


class EngineMachine(RuleBasedStateMachine):
    requests = Bundle("requests")
    chunk_store_fill = "blend"

    def __init__(self) -> None:
        super().__init__()
        self.engine = fake_engine(device_blocks=24, cpu_blocks=12, budget=16, policy="lcas", eviction="cost",
                                  chunk_store_fill=self.chunk_store_fill)
        self.counter = 0
        self.tokens: dict[str, list[int]] = {}

    @rule(target=requests, head=st.sampled_from(["Q: why? ", "Q: how? "]), kv_reuse=st.sampled_from(["exact", "blend"]))
    def open(self, head, kv_reuse):
        self.counter += 1
        rid = f"r{self.counter}"
        self.engine.open(rid, [Segment(text=head)], SamplingParams(max_tokens=3, kv_reuse=kv_reuse))
        return rid

    def _live(self, rid):
        r = self.engine.requests.get(rid)
        return r is not None and not r.is_finished and not r.context_complete

    @rule(rid=requests, segments=docs)
    def append(self, rid, segments):
        if self._live(rid):
            with contextlib.suppress(PromptTooLongError):   # refused whole: nothing changes
                self.engine.append(rid, segments)

    @rule(rid=requests, segments=docs)
    def update(self, rid, segments):
        if self._live(rid):
            with contextlib.suppress(PromptTooLongError):
                self.engine.update(rid, segments)

    @rule(rid=requests)
    def finish(self, rid):
        if self._live(rid):
            self._finish_or_abort(rid)

    def _finish_or_abort(self, rid):
        try:
            self.engine.finish(rid, [Segment(text=" A:")])
        except PromptTooLongError:
            self.engine.abort(rid)

    @rule(rid=consumes(requests))
    def abort(self, rid):
        self.engine.abort(rid)

    @rule(rid=requests, swap=st.booleans())
    def preempt(self, rid, swap):
        request = self.engine.requests.get(rid)
        if request is None or request.state is not RequestState.RUNNING:
            return
        self.engine.scheduler.config = type(self.engine.scheduler.config)(
            16, 256, "swap" if swap else "recompute")
        out = SchedulerOutput()
        self.engine.scheduler.preempt(request, self.engine.clock(), out)
        for _, pairs in out.block_moves:
            self.engine.runner.swap_out(pairs)

    @rule(n=st.integers(1, 4))
    def step(self, n):
        for _ in range(n):
            self._collect(self.engine.step())

    def _collect(self, events):
        for e in events:
            if e.kind is EventKind.TOKEN:
                self.tokens.setdefault(e.request_id, []).append(e.token_id)

    @invariant()
    def blocks_are_accounted_for(self):
        kv = self.engine.scheduler.kv
        kv.check_invariants()
        for r in self.engine.requests.values():
            if not r.is_finished:
                assert r.num_computed_tokens <= r.num_tokens
                held = kv.num_device_blocks(r.request_id) or kv.num_cpu_blocks(r.request_id)
                assert held * kv.block_size >= r.num_computed_tokens

    def teardown(self):
        engine = self.engine
        for rid, r in engine.requests.items():
            if not r.is_finished and not r.context_complete:
                self._finish_or_abort(rid)
        for _ in range(2000):
            if not engine.has_unfinished():
                break
            self._collect(engine.step())
        assert not engine.has_unfinished()
        kv = engine.scheduler.kv
        kv.check_invariants()
        assert kv.device.num_free + kv.chunks.blocks_held(False) == kv.device.num_blocks
        assert kv.cpu.num_free + kv.chunks.blocks_held(True) == kv.cpu.num_blocks
        kv.chunks.clear()       # what the chunk store held is all that was not free
        assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks
        assert engine.scheduler.kv.cpu.num_free == engine.scheduler.kv.cpu.num_blocks
        for rid, r in engine.requests.items():
            if r.finish_reason is not FinishReason.ABORT:
                got = self.tokens.get(rid, [])
                assert got == expected_output(r.prompt_token_ids, 3)[:len(got)], rid
                capacity = engine.scheduler.kv.device.num_blocks * engine.scheduler.kv.block_size
                assert len(got) == 3 or r.num_tokens == capacity, "stopped early with room to grow"


EngineMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
test_block_accounting = EngineMachine.TestCase


class EngineMachineFillAll(EngineMachine):
    """The same, with exact-mode requests filling the chunk store too (`--chunk-store-fill all`)."""

    chunk_store_fill = "all"


EngineMachineFillAll.TestCase.settings = EngineMachine.TestCase.settings
test_block_accounting_fill_all = EngineMachineFillAll.TestCase
