"""Our policies inside vLLM (the scheduler class, inference_svc/vllm_backend/scheduler.py), observed
through the service: the order in which requests' lifecycle events arrive.

    /opt/vllm-venv/bin/python -m pytest --run-vllm -m vllm tests/service/test_vllm_policies.py

On vLLM a streamed request's SCHEDULED event is sent at its first output, i.e. when the prefill
of its first turn (the head) is done; a Generate's FIRST_TOKEN when its prompt is done. With a
small token budget (256 tokens a step) a 1,500-token head takes six steps, so who goes first
is a matter of steps, not of timing.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest

from protos import common_pb2, inference_pb2
from tests.support.inference_calls import collect, finish_msg, open_msg

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

BUDGET = 256
HEAD_TOKENS = 1500
LCAS_HEAD_TOKENS = 512


def head(seed: int, n: int = HEAD_TOKENS) -> list[common_pb2.Segment]:
    ids = [(seed * 7919 + i * 104729) % 40000 + 1000 for i in range(n)]    # distinct prompts: no prefix sharing
    return [common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=ids))]


class Timeline:
    """Lifecycle events of several concurrent calls, in the order the client received them."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str, str]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self.seen: dict[tuple[str, str], threading.Event] = {}

    def watch(self, name: str, responses: Iterator) -> Iterator:
        for response in responses:
            event = response.event
            if event.WhichOneof("kind") == "lifecycle":
                kind = common_pb2.LifecycleEventKind.Name(event.lifecycle.kind).removeprefix("LIFECYCLE_EVENT_KIND_")
                with self._lock:
                    self.events.append((next(self._seq), name, kind))
                self.flag(name, kind).set()
            yield response

    def flag(self, name: str, kind: str) -> threading.Event:
        with self._lock:
            return self.seen.setdefault((name, kind), threading.Event())

    def wait_any(self, keys: list[tuple[str, str]], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(self.flag(*key).is_set() for key in keys):
                return True
            time.sleep(0.02)
        return False

    def at(self, name: str, kind: str) -> int:
        return next(seq for seq, n, k in self.events if n == name and k == kind)


class Calls:
    """Partial streams held open until `release()`, and Generates, each collected in a thread."""

    def __init__(self, stub, timeline: Timeline) -> None:
        self.stub, self.timeline = stub, timeline
        self.gate = threading.Event()
        self.threads: list[threading.Thread] = []
        self.answers: dict[str, object] = {}

    def _run(self, name: str, call) -> None:
        def run() -> None:
            self.answers[name] = collect(self.timeline.watch(name, call()))

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def partial(self, name: str, seed: int, n: int = HEAD_TOKENS) -> None:
        def messages() -> Iterator:
            yield open_msg(name, head(seed, n), max_tokens=1)
            self.gate.wait(900)
            yield finish_msg(common_pb2.Segment(text="\nAnswer:"))

        self._run(name, lambda: self.stub.StreamPrompt(messages(), timeout=900))

    def generate(self, name: str, seed: int, n: int = 64) -> None:
        request = inference_pb2.GenerateRequest(request_id=name, segments=head(seed, n),
                                                sampling=common_pb2.SamplingParams(max_tokens=1))
        self._run(name, lambda: self.stub.Generate(request, timeout=900))

    def release(self) -> None:
        self.gate.set()
        for thread in self.threads:
            thread.join(900)
        assert all(a.done is not None for a in self.answers.values()), self.answers


@pytest.fixture(scope="module", params=["fcfs", "lcas", "default"])
def service(request, embedded_model_dir):
    from tests.support.inference import InferenceProcess

    # LCAS's starvation bound (5 s by default) is a wall-clock rule: far away here, so that the order
    # the tests see does not depend on how loaded the machine is
    running = InferenceProcess(embedded_model_dir, backend="vllm", max_streams=16, policy=request.param,
                                   extra_args=("--token-budget", str(BUDGET), "--lcas-starvation-s", "3600"))
    running.policy = request.param
    yield running
    running.stop()


def test_the_policy_runs_in_our_scheduler_class(service):
    info = service.stub.Describe(inference_pb2.DescribeRequest(), timeout=10).model_info
    assert (info.backend, info.policy, info.eviction_mode) == ("vllm", service.policy, "recompute")
    log = service.handle.log_path.read_text(errors="replace")
    # PolicyStreamingScheduler (async) or PolicyStreamingSyncScheduler where vLLM turns async scheduling off
    ours = "custom scheduler class inference_svc.vllm_backend.scheduler.PolicyStreaming" in log
    assert ours == (service.policy != "default"), "the scheduler class in use is not the policy's"


def test_a_complete_prompt_overtakes_partial_ones_that_arrived_earlier_under_fcfs(service):
    """Three partial heads queue up; a Generate sent once one head is done is answered before
    the last partial head is prefilled under fcfs (and lcas: both serve complete prompts first);
    under vLLM's own FIFO (`default`) it waits for every partial turn ahead of it."""
    timeline = Timeline()
    calls = Calls(service.stub, timeline)
    try:
        for i in range(3):
            calls.partial(f"p{i}", seed=i)
        assert timeline.wait_any([(f"p{i}", "SCHEDULED") for i in range(3)], 600), "no head was ever prefilled"
        calls.generate("complete", seed=500)
        assert timeline.flag("complete", "FIRST_TOKEN").wait(600)
        for i in range(3):
            assert timeline.flag(f"p{i}", "SCHEDULED").wait(600)
    finally:
        calls.release()
    first_token = timeline.at("complete", "FIRST_TOKEN")
    last_partial = max(timeline.at(f"p{i}", "SCHEDULED") for i in range(3))
    if service.policy == "default":
        assert first_token > last_partial, timeline.events
    else:
        assert first_token < last_partial, timeline.events
    service.wait_until_all_blocks_free()


def test_lcas_favours_the_request_with_the_most_recent_chunk(service):
    """Two partial heads opened one after the other: fcfs (and vLLM's FIFO) finish the older first,
    lcas the newer (its chunk arrived last)."""
    timeline = Timeline()
    calls = Calls(service.stub, timeline)
    try:
        calls.partial("older", seed=1000, n=LCAS_HEAD_TOKENS)
        assert timeline.flag("older", "QUEUED").wait(600)
        calls.partial("newer", seed=2000, n=LCAS_HEAD_TOKENS)
        for name in ("older", "newer"):
            assert timeline.flag(name, "SCHEDULED").wait(600)
    finally:
        calls.release()
    newer_first = timeline.at("newer", "SCHEDULED") < timeline.at("older", "SCHEDULED")
    assert newer_first == (service.policy == "lcas"), timeline.events
    service.wait_until_all_blocks_free()
