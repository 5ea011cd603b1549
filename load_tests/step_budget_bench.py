"""`streamrag bench steps`: step times, cancel latency and a new request's TTFT behind a long prefill,
with the fixed token budget against steps bounded in time (`--step-time-target-ms`).

One scenario per seed, in one in-process engine driven by its engine thread as the service drives it
(commands between steps; the cancel is the servicer's own `abort_soon`): two long prompts of
`--prompt-tokens` random tokens whose context is still arriving (append mode: prefilled ahead with the
whole budget) start together; at a seeded moment one of them is cancelled, at another a short complete
prompt arrives (greedy, one token). Measured per run:
- step time: the wall time of every engine step from the start until both events are served and the
  long prompt that stays is prefilled; p50, p99;
- cancel latency: from the cancel to its abort applied (the request finished, its blocks free), and how
  many steps ran in between;
- the new request's TTFT: from its arrival to its first token;
- what bounded steps cost: tokens computed per second of step time over the same steps.
Each arm runs the seeds on one engine (its online refit carries on across them), after one warm-up.
The cost model is the profile given for each dtype (`--profile-dir`, measured with `streamrag profile`),
else the cache's, else the built-in estimate; the JSON names which. Rows are the median over seeds with
the min-max spread.

    streamrag bench steps --dtypes float32,bfloat16 \\
        --raw /tmp/steps-bench --json docs/results/steps.json

writes `{"config": {...}, "rows": [{"dtype", "arm", "target_ms", "token_budget", "step_ms_p50",
"step_ms_p99", "cancel_ms", "cancel_steps", "new_ttft_ms", "budget_p50", "tokens_per_s", "cost_model"}, ...]}` (each
figure `{"median", "min", "max"}` over the seeds) and the per-run rows under `--raw`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from load_tests.runner import add_seeds_arg, positive_float, positive_int, spread, write_json
from servicekit.progress import say

WARMUP_TOKENS = 512
SHORT_TOKENS = 64
EVENT_WINDOW_S = (0.3, 1.5)         # the cancel and the new request come this long after the start


def add_bench_steps_args(parser: argparse.ArgumentParser) -> None:
    from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_STEP_TIME_TARGET_MS, DEFAULT_TOKEN_BUDGET

    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated")
    add_seeds_arg(parser)
    parser.add_argument("--prompt-tokens", type=positive_int, default=4000, help="each long prompt's tokens")
    parser.add_argument("--token-budget", type=positive_int, default=DEFAULT_TOKEN_BUDGET,
                        help="the fixed budget, and the cap of bounded steps")
    parser.add_argument("--target-ms", type=positive_float, default=DEFAULT_STEP_TIME_TARGET_MS,
                        help="step-time target of the bounded arm")
    parser.add_argument("--profile-dir", type=Path, default=None,
                        help="cost profiles named profile-<dtype>.json (default: the cache's, as the service)")
    parser.add_argument("--raw", type=Path, default=Path("/tmp/steps-bench"), help="per-run rows go here")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")


@dataclass
class Run:
    """One scenario's request ids and the moments the observer saw (perf_counter seconds)."""

    ids: dict[str, str]
    steps: list[tuple[float, int, int]] = field(default_factory=list)   # (ms, tokens, budget) per step
    cancel_at: float | None = None
    cancel_step: int = 0                 # steps ended when the cancel came
    cancel_done: float | None = None
    cancel_steps: int | None = None      # steps that ended between the cancel and its abort
    arrive_at: float | None = None
    first_token: float | None = None
    prefilled: float | None = None       # the long prompt that stays holds all its KV
    # the cancel and the arrival served, the long prompt that stays prefilled
    served: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)    # every request of the run gone


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


class Driver:
    """The engine on its engine thread, with an observer that times each scenario's events."""

    def __init__(self, engine) -> None:
        from inference_svc.native.engine_thread import EngineThread

        self.engine = engine
        self.run: Run | None = None
        self.thread = EngineThread(engine, self._on_step)

    def _on_step(self, seconds: float | None, events: list) -> None:
        from inference_svc.engine.events import EventKind

        run, now = self.run, time.perf_counter()
        if run is None:
            return
        if seconds is not None and not run.served.is_set():
            last = self.engine.last_step
            run.steps.append((seconds * 1e3, last.tokens, last.budget))
        for event in events:
            if event.kind is EventKind.FINISHED and event.request_id == run.ids["c"]:
                run.cancel_done = now
                run.cancel_steps = self.engine.counters.steps - run.cancel_step
            elif event.kind is EventKind.FIRST_TOKEN and event.request_id == run.ids["new"]:
                run.first_token = now
            elif event.kind is EventKind.KV_ON_GPU and event.request_id == run.ids["a"]:
                run.prefilled = now
        if run.first_token is not None and run.cancel_done is not None and run.prefilled is not None:
            run.served.set()
        if run.served.is_set() and not any(rid in self.engine.requests and not self.engine.requests[rid].is_finished
                                           for rid in run.ids.values()):
            run.closed.set()

    def scenario(self, seed: int, prompt_tokens: int) -> dict[str, Any]:
        from inference_svc.engine.request import Segment
        from inference_svc.engine.sampler import SamplingParams

        engine, thread = self.engine, self.thread
        rng = random.Random(seed)
        vocab = engine.runner.config.vocab_size
        prompt = lambda n: [Segment(token_ids=tuple(rng.randrange(min(100, vocab // 2), vocab) for _ in range(n)))]  # noqa: E731
        long_a, long_c, short = prompt(prompt_tokens), prompt(prompt_tokens), prompt(SHORT_TOKENS)
        cancel_s, arrive_s = rng.uniform(*EVENT_WINDOW_S), rng.uniform(*EVENT_WINDOW_S)
        run = self.run = Run({name: f"seed{seed}-{name}" for name in ("a", "c", "new")})
        greedy = SamplingParams(max_tokens=1)

        def start(engine) -> None:           # context still arriving: prefilled ahead, append mode
            engine.open(run.ids["a"], long_a, greedy)
            engine.open(run.ids["c"], long_c, greedy)

        def arrive(engine) -> None:
            engine.open(run.ids["new"], short, greedy)
            engine.finish(run.ids["new"])

        def cancel() -> None:
            run.cancel_at, run.cancel_step = time.perf_counter(), engine.counters.steps
            thread.abort_soon(run.ids["c"])      # what the servicer does when a call is cancelled

        def new_request() -> None:
            run.arrive_at = time.perf_counter()
            thread.post(arrive)

        thread.post(start)
        timers = [threading.Timer(cancel_s, cancel), threading.Timer(arrive_s, new_request)]
        for timer in timers:
            timer.start()
        if not run.served.wait(900):
            raise RuntimeError("the scenario was not served in 15 minutes")
        thread.abort_soon(run.ids["a"])
        if not run.closed.wait(900):
            raise RuntimeError("the long prompt was not aborted in 15 minutes")
        step_ms = [ms for ms, _, _ in run.steps]
        return {
            "seed": seed, "cancel_after_s": round(cancel_s, 3), "arrive_after_s": round(arrive_s, 3),
            "step_ms": [round(ms, 1) for ms in step_ms], "tokens": [n for _, n, _ in run.steps],
            "budgets": [b for _, _, b in run.steps],
            "step_ms_p50": statistics.median(step_ms), "step_ms_p99": percentile(step_ms, 99),
            "cancel_ms": (run.cancel_done - run.cancel_at) * 1e3, "cancel_steps": run.cancel_steps,
            "new_ttft_ms": (run.first_token - run.arrive_at) * 1e3,
            "budget_p50": statistics.median(b for _, _, b in run.steps),
            "tokens_per_s": sum(n for _, n, _ in run.steps) / sum(step_ms) * 1e3,
        }

    def warm_up(self) -> None:
        """One short prefill and decode, so the first scenario does not pay first-call costs."""
        from inference_svc.engine.request import Segment
        from inference_svc.engine.sampler import SamplingParams

        rng = random.Random(12345)
        vocab = self.engine.runner.config.vocab_size
        tokens = tuple(rng.randrange(min(100, vocab // 2), vocab) for _ in range(WARMUP_TOKENS))
        gone = threading.Event()
        self.run = None
        self.thread.post(lambda engine: (engine.open("warm-up", [Segment(token_ids=tokens)],
                                                     SamplingParams(max_tokens=4)), engine.finish("warm-up")))

        def check(engine) -> None:
            if "warm-up" not in engine.requests:
                gone.set()

        while not gone.wait(0.2):
            self.thread.post(check)


def build(args: argparse.Namespace, dtype: str, target_ms: float | None):
    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.engine import EngineConfig
    from inference_svc.engine.factory import EngineSpec, build_engine

    model_dir = args.model or prepare_embedded_model(progress=False)
    profile = args.profile_dir / f"profile-{dtype}.json" if args.profile_dir else None
    if profile is not None and not profile.exists():
        raise SystemExit(f"error: no profile {profile} (streamrag profile --dtype {dtype} --out {profile})")
    engine = build_engine(EngineSpec(model_dir=Path(model_dir), device=args.device, dtype=dtype,
                                     kv_device_blocks=-(-(3 * args.prompt_tokens + 1024) // 16),
                                     profile=profile,
                                     engine=EngineConfig(token_budget=args.token_budget,
                                                         step_time_target_ms=target_ms)))
    return engine


def run_bench_steps(args: argparse.Namespace) -> int:
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    args.raw.mkdir(parents=True, exist_ok=True)
    rows, raw = [], []
    for dtype in dtypes:
        for arm, target in (("fixed", None), ("bounded", args.target_ms)):
            engine = build(args, dtype, target)
            driver = Driver(engine)
            driver.thread.start()
            try:
                driver.warm_up()
                runs = []
                for seed in args.seeds:
                    result = driver.scenario(seed, args.prompt_tokens)
                    result.update(dtype=dtype, arm=arm, target_ms=target)
                    runs.append(result)
                    say(f"[{dtype} {arm} seed {seed}] steps p50 {result['step_ms_p50']:.0f} ms "
                        f"p99 {result['step_ms_p99']:.0f} ms; cancel {result['cancel_ms']:.0f} ms "
                        f"({result['cancel_steps']} steps); new TTFT {result['new_ttft_ms']:.0f} ms; "
                        f"budget p50 {result['budget_p50']:.0f}")
            finally:
                driver.thread.stop()
            raw += runs
            rows.append(summary_row(runs, dtype, arm, target, args.token_budget, engine.cost_model.source))
    write_json(args.raw / "runs.json", raw)
    summary = {"config": {"prompt_tokens": args.prompt_tokens, "short_tokens": SHORT_TOKENS,
                          "seeds": args.seeds, "event_window_s": list(EVENT_WINDOW_S), "device": args.device},
               "rows": rows}
    print(table(rows))
    if args.json:
        write_json(args.json, summary)
    return 0


def summary_row(runs: list[dict], dtype: str, arm: str, target: float | None, budget: int, source: str) -> dict:
    row: dict[str, Any] = {"dtype": dtype, "arm": arm, "target_ms": target, "token_budget": budget,
                           "cost_model": "built-in" if source == "built-in" else Path(source).name}
    for key in ("step_ms_p50", "step_ms_p99", "cancel_ms", "new_ttft_ms", "budget_p50", "tokens_per_s"):
        row[key] = {k: round(v, 1) for k, v in spread([r[key] for r in runs]).items()}
    row["cancel_steps"] = max(r["cancel_steps"] for r in runs)
    return row


def table(rows: list[dict]) -> str:
    fmt = lambda s: f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})"  # noqa: E731
    lines = ["| dtype | budget | step p50 ms | step p99 ms | cancel ms | steps to cancel | new TTFT ms | "
             "budget p50 | tokens/s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        arm = f"fixed {r['token_budget']}" if r["arm"] == "fixed" else f"{r['target_ms']:g} ms target"
        lines.append(f"| {r['dtype']} | {arm} | {fmt(r['step_ms_p50'])} | {fmt(r['step_ms_p99'])} | "
                     f"{fmt(r['cancel_ms'])} | {r['cancel_steps']} | {fmt(r['new_ttft_ms'])} | "
                     f"{fmt(r['budget_p50'])} | {fmt(r['tokens_per_s'])} |")
    return "\n".join(lines)
