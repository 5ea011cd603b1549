"""Build an engine over the fake runner and compute what it must answer."""

from __future__ import annotations

from inference_svc.engine.engine import Engine, EngineConfig
from inference_svc.engine.events import EventKind
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.tokenization import SegmentTokenizer
from tests.engine.fake_runner import CharTokenizer, FakeRunner, next_token

BLOCK = 4


def fake_engine(
    *,
    device_blocks: int = 64,
    cpu_blocks: int = 64,
    policy: str = "default",
    eviction: str = "cost",
    budget: int = 32,
    predict=next_token,
    **config,
) -> Engine:
    runner = FakeRunner(device_blocks, cpu_blocks, BLOCK, predict=predict)
    return Engine(
        runner,
        SegmentTokenizer(CharTokenizer()),
        EngineConfig(
            num_device_blocks=device_blocks,
            num_cpu_blocks=cpu_blocks,
            block_size=BLOCK,
            token_budget=budget,
            policy=policy,
            eviction=eviction,
            **config,
        ),
    )


def expected_output(prompt: list[int], max_tokens: int, predict=next_token) -> list[int]:
    tokens, out = list(prompt), []
    for _ in range(max_tokens):
        out.append(predict(tokens))
        tokens.append(out[-1])
    return out


def run_to_completion(engine: Engine, max_steps: int = 10_000, events: list | None = None) -> list:
    """Step `engine` until nothing is unfinished; returns the events (appended to `events` if given)."""
    events = [] if events is None else events
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return events
        events.extend(engine.step())
    raise AssertionError("engine did not finish")


def tokens_of(events, request_id: str) -> list[int]:
    return [e.token_id for e in events if e.request_id == request_id and e.kind is EventKind.TOKEN]


def capture_plans(engine: Engine) -> list:
    """Record the scheduler's output of every step `engine` runs from now on; the list fills as it steps."""
    plans = []
    schedule = engine.scheduler.schedule

    def capture(drafts=None):
        plans.append(out := schedule(drafts))
        return out

    engine.scheduler.schedule = capture
    return plans


GREEDY = SamplingParams(max_tokens=6)
