"""The scheduler is the only owner of the KV manager, and keeps the one request registry."""

from __future__ import annotations

import ast
from pathlib import Path

from inference_svc.engine.request import RequestState
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.scheduler import BlockMove, PreemptionKind
from tests.engine.engine_helpers import fake_engine, run_to_completion

ROOT = Path(__file__).resolve().parents[2]


def attribute_uses(path: Path, name: str) -> list[int]:
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == name]


def test_only_the_scheduler_touches_the_kv_manager():
    users = {}
    for path in sorted((ROOT / "inference_svc").rglob("*.py")):
        if path.name in ("scheduler.py", "kv_manager.py"):
            continue
        if lines := attribute_uses(path, "kv"):
            users[str(path.relative_to(ROOT))] = lines
    assert not users, f"these read or write the KV manager past the scheduler: {users}"


def test_one_registry_holds_a_request_until_it_is_released():
    engine = fake_engine()
    assert engine.requests is engine.scheduler.requests
    from inference_svc.engine.request import Segment

    engine.open("r", [Segment(text="hello there")], SamplingParams(max_tokens=2))
    engine.finish("r")
    run_to_completion(engine)
    assert engine.requests["r"].state is RequestState.FINISHED           # still there: its stats are read
    assert engine.scheduler.rank(0.0) == []                               # but no longer ranked
    assert engine.release("r") is not None and "r" not in engine.scheduler.requests
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks


def test_block_moves_and_preemptions_are_enums():
    engine = fake_engine(device_blocks=12, cpu_blocks=64, budget=64, eviction="swap")
    from inference_svc.engine.request import Segment

    for i in range(3):   # 3 x (12 prompt + 12 generated) tokens need 18 blocks of 4, the pool has 12: preemption
        engine.open(f"r{i}", [Segment(text=chr(97 + i) * 12)], SamplingParams(max_tokens=12))
    kinds, moves = set(), set()
    original = engine.scheduler.schedule

    def capture(drafts=None):
        out = original(drafts)
        kinds.update(p.kind for p in out.preempted)
        moves.update(direction for direction, _ in out.block_moves)
        return out

    engine.scheduler.schedule = capture
    for i in range(3):
        engine.finish(f"r{i}")
    run_to_completion(engine)
    assert kinds <= set(PreemptionKind) and moves <= set(BlockMove)
    assert PreemptionKind.SWAP in kinds and BlockMove.OUT in moves
