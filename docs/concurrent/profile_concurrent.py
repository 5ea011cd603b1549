"""Where the native engine's time goes under concurrency (docs/benchmarks.md, "Prefill under
concurrency"): the `bench concurrent` burst (16 prompts of 1,150 random tokens, max_tokens 1,
the default token budget and dtype) run on the engine directly, without gRPC.

1. Engine level: per step, wall time, the runner's share of it (the rest is the scheduler,
   sampling and bookkeeping in Python), tokens and the chunks' (start, length).
2. Runner level: the same packed shapes timed alone, against the chunks run one by one and
   against each chunk as if it started at position 0 (no cached prefix: what a continued
   chunk's gather and masked attention cost), and torch.profiler's op split of one step.

    PYTHONPATH=. flock /tmp/streamrag-cpu.lock .venv/bin/python docs/concurrent/profile_concurrent.py
"""

from __future__ import annotations

import random
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from inference_svc.embedded_model import prepare_embedded_model
from inference_svc.engine.factory import EngineSpec, build_engine
from inference_svc.engine.model_runner import ChunkInput
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from load_tests.concurrent_bench import random_prompt

CONCURRENCY, TOKENS = 16, 1150


def burst(engine, tag: str) -> list[dict]:
    rng = random.Random(tag)
    vocab = engine.runner.config.vocab_size
    for i in range(CONCURRENCY):
        rid = f"{tag}-{i}"
        engine.open(rid, [Segment(token_ids=tuple(random_prompt(vocab, TOKENS, rng)))],
                    SamplingParams(max_tokens=1, ignore_eos=True))
        engine.finish(rid)
    steps: list[dict] = []
    execute = engine.runner.execute

    def timed(chunks):
        started = time.perf_counter()
        try:
            return execute(chunks)
        finally:
            steps[-1].update(runner_ms=(time.perf_counter() - started) * 1e3,
                             shapes=[(c.start_pos, len(c.token_ids)) for c in chunks])

    engine.runner.execute = timed
    try:
        while engine.has_unfinished():
            steps.append({"runner_ms": 0.0, "shapes": []})
            started = time.perf_counter()
            engine.step()
            steps[-1].update(wall_ms=(time.perf_counter() - started) * 1e3, tokens=engine.last_step_tokens)
            engine.take_events()
            for request_id in [r for r, req in engine.requests.items() if req.is_finished]:
                engine.release(request_id)
    finally:
        engine.runner.execute = execute
    return steps


def ms(fn, reps: int = 3) -> float:
    fn()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def runner_level(engine, shapes: list[tuple[int, int]]) -> None:
    runner, bs = engine.runner, engine.config.block_size
    next_block = iter(range(1, 10**9))

    def chunk(start: int, n: int, table: list[int]) -> ChunkInput:
        return ChunkInput(list(range(300, 300 + n)), start, table, True, 1)

    tables = [[next(next_block) for _ in range(-(-(s + n) // bs))] for s, n in shapes]
    packed = [chunk(s, n, t) for (s, n), t in zip(shapes, tables, strict=True)]
    from_zero = [chunk(0, n, t) for (_, n), t in zip(shapes, tables, strict=True)]
    together = ms(lambda: runner.execute(packed))
    alone = sum(ms(lambda c=c: runner.execute([c])) for c in packed)
    at_zero = ms(lambda: runner.execute(from_zero))
    print(f"step {shapes}: packed {together:.0f} ms, chunks one by one {alone:.0f} ms, "
          f"same lengths from position 0 {at_zero:.0f} ms", flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.execute(packed)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14), flush=True)


def main() -> None:
    spec = EngineSpec(model_dir=prepare_embedded_model(progress=False))
    engine = build_engine(spec)
    print(f"dtype {spec.dtype}, token budget {engine.config.token_budget}, torch threads {torch.get_num_threads()}")
    burst(engine, "warm")
    started = time.perf_counter()
    steps = burst(engine, "measured")
    wall = time.perf_counter() - started
    print(f"{CONCURRENCY} x {TOKENS} tokens: {len(steps)} steps, {wall:.2f} s, "
          f"{CONCURRENCY * TOKENS / wall:.0f} tokens/s")
    runner_total = sum(s["runner_ms"] for s in steps)
    print(f"runner {runner_total / 1e3:.2f} s of {sum(s['wall_ms'] for s in steps) / 1e3:.2f} s stepping; "
          f"outside the runner per step: median "
          f"{statistics.median(s['wall_ms'] - s['runner_ms'] for s in steps):.1f} ms")
    print("| step | tokens | wall ms | runner ms | chunks (start, length) |\n|---:|---:|---:|---:|---|")
    for i, s in enumerate(steps):
        print(f"| {i} | {s['tokens']} | {s['wall_ms']:.0f} | {s['runner_ms']:.0f} | {s['shapes']} |")
    busiest = max(steps, key=lambda s: sum(1 for start, _ in s["shapes"] if start > 0))
    runner_level(engine, busiest["shapes"])
    runner_level(engine, [(0, 1024), (0, 1024)])
    runner_level(engine, [(0, 2048)])


if __name__ == "__main__":
    main()
