"""Where a session query's time goes (docs/benchmarks.md, "Sessions and Flash Queries (round 2)").

One torch thread, CPU time of this thread (insensitive to other processes' load):
1. one forward (`ModelRunner.execute`) of 16 and 40 new tokens after 1k-7.5k cached tokens, and
   the op-level split of the 16-token forward at 1k and 7.5k (torch.profiler);
2. at the engine level, a session query (fork + its step) against a warm Generate (prefix cache)
   of the same context with another question, at `sys.argv[1]` context sizes.

    PYTHONPATH=. flock /tmp/streamrag-cpu.lock python docs/sessions/profile_sessions.py 1000,4000,7500
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from inference_svc.chat_format import chat_format
from inference_svc.embedded_model import prepare_embedded_model
from inference_svc.engine.events import EventKind
from inference_svc.engine.factory import EngineSpec, build_engine
from inference_svc.engine.model_runner import ChunkInput
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.sessions import SessionFormat, SessionManager
from load_tests.sessions_bench import INSTRUCTIONS, QUESTIONS, LogFeed

torch.set_num_threads(1)


def cpu_ms(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        started = time.thread_time()
        fn()
        times.append((time.thread_time() - started) * 1e3)
    return statistics.median(times)


def forwards(engine) -> None:
    runner = engine.runner

    def chunk(start: int, n: int) -> ChunkInput:
        blocks = -(-(start + n) // 16)
        return ChunkInput(list(range(100, 100 + n)), start, list(range(1, blocks + 1)), True, 1)

    for start in (1000, 2000, 4000, 7500):
        print(f"ctx {start}: 16-token chunk {cpu_ms(lambda s=start: runner.execute([chunk(s, 16)])):.1f} ms cpu; "
              f"40-token {cpu_ms(lambda s=start: runner.execute([chunk(s, 40)])):.1f} ms", flush=True)
    for start in (1000, 7500):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                runner.execute([chunk(start, 16)])
        print(f"--- ctx {start}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def queries(engine, targets: list[int]) -> None:
    chat = chat_format(engine.tokenizer.tokenizer, tuple(engine.runner.eos_token_ids))
    fmt = SessionFormat(chat.prompt_prefix + chat.user_prefix, chat.user_suffix + chat.assistant_prefix)
    manager = SessionManager(engine, fmt)
    manager.create("s", INSTRUCTIONS)
    tokenizer = engine.tokenizer.tokenizer
    feed = LogFeed(0, lambda text: len(tokenizer.encode(text, add_special_tokens=False)))
    sampling = SamplingParams(max_tokens=1)

    def until_first_token(request_id: str) -> list[tuple[float, int]]:
        steps = []
        while True:
            started = time.thread_time()
            events = engine.step()
            steps.append((round((time.thread_time() - started) * 1e3, 1), engine.last_step_tokens))
            manager.observe(None, events)
            if any(e.kind is EventKind.TOKEN and e.request_id == request_id for e in events):
                return steps

    data: list[str] = []
    for target in targets:
        info = manager.describe("s")
        segments = feed.take(target - info.head_tokens - info.data_tokens)
        data += [text for text, _ in segments]
        manager.ingest("s", [Segment(text=text) for text, _ in segments])
        while manager.describe("s").state != "ready":
            manager.observe(None, engine.step())
        query_ms, fork_ms, query_steps = [], [], []
        for i, question in enumerate(QUESTIONS[:5]):
            request_id = f"q{target}-{i}"
            started = time.perf_counter()
            manager.query("s", question, sampling, request_id)
            forked = time.perf_counter()
            query_steps.append(until_first_token(request_id))
            fork_ms.append((forked - started) * 1e3)
            query_ms.append((time.perf_counter() - started) * 1e3)
        head = fmt.head("[tag] " + INSTRUCTIONS)
        warm = []
        for i, question in enumerate(QUESTIONS[6:10]):      # the first fills the prefix cache
            request_id = f"g{target}-{i}"
            started = time.perf_counter()
            engine.open(request_id, [head, *(Segment(text=t) for t in data), fmt.query(question)], sampling)
            engine.finish(request_id)
            steps = until_first_token(request_id)
            if i:
                warm.append(((time.perf_counter() - started) * 1e3, steps))
        print(f"ctx {manager.describe('s').computed_tokens}: query {statistics.median(query_ms):.1f} ms "
              f"(fork {statistics.median(fork_ms):.2f} ms; steps {query_steps[2]}) | warm generate "
              f"{statistics.median(ms for ms, _ in warm):.1f} ms (steps {warm[1][1]})", flush=True)


if __name__ == "__main__":
    model = build_engine(EngineSpec(prepare_embedded_model(progress=False), dtype="auto", kv_device_blocks=2048))
    forwards(model)
    queries(model, [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "1000,4000,7500").split(",")])
