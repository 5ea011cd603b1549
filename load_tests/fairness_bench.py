"""`streamrag bench fairness`: two tenants on one replica, with fair share off and on.

A local stack of its own: a private Redis, one native replica (fp32, policy fcfs, `--max-running`
small so that a flood queues) and an orchestrator with a tenants file, each its own process. The
clients are the orchestrator's `Inference.Generate` callers (plain prompts of random token ids,
greedy, `--max-tokens`), each with its tenant's key:

- tenant `light`: one user with `--think-s` between asks;
- tenant `flood`: `--flood-users` users with no think time.

Per seed, for `--duration` seconds each, in one go:

1. `solo`: light alone;
2. `fcfs`: light beside the flood, the replica started with `--fair-share off` (plain FCFS);
3. `fair`: the same, `--fair-share on` (engine/fair_share.py);
4. `share 1:1`, `share 3:1`: two flooding tenants (weights 1 and 1, then 3 and 1), both backlogged: each
   one's share of the served tokens (prompt + generated of the answers completed in the window) against
   its weight's.

Every tenant has `max_queue_s` = `--max-queue-s`: a request that cannot start in time is answered
UNAVAILABLE (the gateway's 503) instead of waiting. An ask is `hung` when it got neither its first token
nor an error within `max_queue_s` + 5 s. The JSON has, per seed and as the median over seeds (with
min-max, load_tests/runner.py): `light_ttft_p95_solo_s`, `light_ttft_p95_fcfs_s`, `light_ttft_p95_fair_s`,
`throughput_fair_over_fcfs` (prompt + generated tokens of every answer, per second from the first ask to
the last answer), `share_error` (per weight setting: the largest relative gap
between a tenant's share and its weight's), `rejected` (by tenant and status) and `hung`.

    streamrag bench fairness --json fairness.json --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from load_tests.runner import add_seeds_arg, positive_float, positive_int, spread, write_json
from protos import common_pb2, inference_pb2, inference_pb2_grpc
from servicekit.auth import bearer_metadata
from servicekit.health import check_health
from servicekit.progress import say
from servicekit.stats import percentile

HANG_GRACE_S = 5.0
SHARES = {"1:1": (("flood", 1.0), ("second", 1.0)), "3:1": (("heavy", 3.0), ("flood", 1.0))}
PHASES = ("solo", "fcfs", "fair", *(f"share {name}" for name in SHARES))


def add_bench_fairness_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    add_seeds_arg(parser)
    parser.add_argument("--duration", type=positive_float, default=60.0, help="seconds each run sends (default 60)")
    parser.add_argument("--flood-users", type=positive_int, default=8, help="users of each flooding tenant")
    parser.add_argument("--think-s", type=positive_float, default=2.0, help="the light user's pause between asks")
    parser.add_argument("--prompt-tokens", type=positive_int, default=128)
    parser.add_argument("--max-tokens", type=positive_int, default=16)
    parser.add_argument("--max-running", type=positive_int, default=4, help="the replica's --max-running")
    parser.add_argument("--max-queue-s", type=positive_float, default=20.0, help="every tenant's max_queue_s")
    parser.add_argument("--model", type=Path, default=None, help="default: the embedded SmolLM2-135M-Instruct")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tenants_file(directory: Path, max_queue_s: float) -> Path:
    names = {"light": 1.0, "flood": 1.0, "second": 1.0, "heavy": 3.0}
    path = directory / "tenants.toml"
    path.write_text("".join(f'[tenants.{name}]\nkeys = ["key-{name}"]\nweight = {weight}\n'
                            f'max_queue_s = {max_queue_s}\n\n' for name, weight in names.items()))
    return path


# ---------------------------------------------------------------------------- the stack

@dataclass
class Stack:
    """Redis, one replica and one orchestrator, as processes; `stop()` ends them all."""

    workdir: Path
    processes: list[subprocess.Popen] = field(default_factory=list)
    replica: Any = None

    def _wait(self, check: str, target: str, what: str, process: subprocess.Popen, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while (reason := check_health(check, target, 2.0)) is not None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start ({reason}); see {self.workdir}")
            time.sleep(0.2)

    def start(self, args: argparse.Namespace, fair: bool) -> str:
        """Start Redis, the replica (fair share on or off) and the orchestrator; the orchestrator's address."""
        redis_port, orchestrator_port = free_port(), free_port()
        redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--bind",
                                  "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.processes.append(redis)
        self._wait("redis", f"redis://127.0.0.1:{redis_port}/0", "redis", redis)
        from inference_svc.launch import start_inference_service

        self.replica = start_inference_service(
            "native", args.model, policy="fcfs", dtype="float32", metrics_port=-1,
            extra_args=["--fair-share", "on" if fair else "off", "--max-running", str(args.max_running)],
            log_path=self.workdir / f"inference-{'fair' if fair else 'fcfs'}.log")
        log = open(self.workdir / "orchestrator.log", "a")   # noqa: SIM115 - the process's, closed by the OS
        orchestrator = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.server", "--host", "127.0.0.1", "--port", str(orchestrator_port),
             "--metrics-port", "-1", "--redis", f"redis://127.0.0.1:{redis_port}/0", "--inference",
             self.replica.address, "--anns", "", "--crawler", "", "--tenants",
             str(tenants_file(self.workdir, args.max_queue_s)), "--log-level", "WARNING"],
            stdout=log, stderr=subprocess.STDOUT, env={k: v for k, v in os.environ.items() if k != "STREAMRAG_API_KEY"})
        self.processes.append(orchestrator)
        address = f"127.0.0.1:{orchestrator_port}"
        self._wait("grpc", address, "the orchestrator", orchestrator)
        return address

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes.clear()
        if self.replica is not None:
            self.replica.stop()
            self.replica = None


# ---------------------------------------------------------------------------- the load

@dataclass
class Ask:
    tenant: str
    sent: float
    first_token: float | None = None
    ended: float | None = None
    status: str = ""              # "ok" or the gRPC status name
    tokens: int = 0               # prompt + generated, when answered


async def ask(stub, tenant: str, prompt: list[int], max_tokens: int, asks: list[Ask]) -> None:
    record = Ask(tenant, time.monotonic())
    asks.append(record)
    request = inference_pb2.GenerateRequest(request_id=uuid.uuid4().hex, sampling=common_pb2.SamplingParams(
        max_tokens=max_tokens), segments=[common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=prompt))])
    try:
        async for response in stub.Generate(request, timeout=600, metadata=bearer_metadata(f"key-{tenant}")):
            kind = response.event.WhichOneof("kind")
            if kind == "token" and record.first_token is None:
                record.first_token = time.monotonic()
            elif kind == "done":
                stats = response.event.done.stats
                record.tokens, record.status = stats.prompt_tokens + stats.generated_tokens, "ok"
    except grpc.RpcError as exc:
        record.status = exc.code().name
    finally:
        record.ended = time.monotonic()


async def user(stub, tenant: str, rng: random.Random, args: argparse.Namespace, until: float, think_s: float,
               asks: list[Ask]) -> None:
    while time.monotonic() < until:
        prompt = [rng.randrange(1000, 40000) for _ in range(args.prompt_tokens)]
        await ask(stub, tenant, prompt, args.max_tokens, asks)
        if think_s:
            await asyncio.sleep(rng.uniform(0.5, 1.5) * think_s)


async def run_phase(address: str, users: list[tuple[str, float]], args: argparse.Namespace,
                    seed: int) -> tuple[list[Ask], float, float]:
    """`users`: (tenant, think time) each; returns the asks, the start and the end of sending."""
    asks: list[Ask] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        started = time.monotonic()
        until = started + args.duration
        tasks = [asyncio.create_task(user(stub, tenant, random.Random(f"{seed}-{i}"), args, until, think, asks))
                 for i, (tenant, think) in enumerate(users)]
        # the last asks get their answer or refusal; past max_queue_s + the grace they count as hung
        _, pending = await asyncio.wait(tasks, timeout=args.duration + args.max_queue_s + HANG_GRACE_S + 120)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return asks, started, until


def hung_ask(a: Ask, max_queue_s: float) -> bool:
    """Neither a first token nor an error within `max_queue_s` + the grace (or never)."""
    answered_at = a.first_token if a.first_token is not None else a.ended if a.status not in ("", "ok") else None
    return answered_at is None or answered_at - a.sent > max_queue_s + HANG_GRACE_S


def summarize(asks: list[Ask], started: float, until: float, max_queue_s: float) -> dict[str, Any]:
    light = [a.first_token - a.sent for a in asks if a.tenant == "light" and a.first_token is not None]
    answered = [a for a in asks if a.status == "ok" and a.ended is not None]
    tokens = Counter()                     # served while every tenant was backlogged: answers ended in the window
    for a in answered:
        if a.ended <= until:
            tokens[a.tenant] += a.tokens
    last = max((a.ended for a in answered), default=until)
    rejected = Counter(f"{a.tenant}/{a.status}" for a in asks if a.status not in ("ok", "", "CANCELLED"))
    hung = sum(1 for a in asks if hung_ask(a, max_queue_s))
    return {"light_ttft_p95_s": round(percentile(light, 95), 3) if light else None,
            "light_ttft_p50_s": round(percentile(light, 50), 3) if light else None,
            "light_asks": len(light), "asks": len(asks), "tokens_by_tenant": dict(tokens),
            "tokens_per_s": round(sum(a.tokens for a in answered) / (last - started), 1),   # every answer
            "rejected": dict(rejected), "hung": hung}


def share_error(tokens: dict[str, int], weights: tuple[tuple[str, float], ...]) -> float:
    total, weight_sum = sum(tokens.get(t, 0) for t, _ in weights), sum(w for _, w in weights)
    if not total:
        return float("nan")
    return round(max(abs(tokens.get(t, 0) / total - w / weight_sum) / (w / weight_sum) for t, w in weights), 4)


# ---------------------------------------------------------------------------- the bench

def run(args: argparse.Namespace) -> dict[str, Any]:
    per_seed: dict[int, dict[str, Any]] = {seed: {"seed": seed} for seed in args.seeds}
    light = [("light", args.think_s)]
    flood = [("flood", 0.0)] * args.flood_users
    workdir = Path(tempfile.mkdtemp(prefix="streamrag-fairness-"))
    for fair in (False, True):
        stack = Stack(workdir)
        try:
            say(f"starting the stack (fair share {'on' if fair else 'off'}) in {workdir}")
            address = stack.start(args, fair)
            asyncio.run(run_phase(address, [("light", 0.0)], argparse.Namespace(**{**vars(args), "duration": 5.0}),
                                  -1))                                    # warm-up, not measured
            for seed in args.seeds:
                out = per_seed[seed]
                phases = {"fair": light + flood} if fair else {"fcfs": light + flood}
                if fair:
                    phases = {"solo": light, **phases,
                              **{f"share {name}": [(t, 0.0) for t, _ in pair] * args.flood_users
                                 for name, pair in SHARES.items()}}
                for name, users in phases.items():
                    say(f"seed {seed}: {name} ({len(users)} users, {args.duration:g} s)")
                    out[name] = summarize(*asyncio.run(run_phase(address, users, args, seed)), args.max_queue_s)
        finally:
            stack.stop()
    seeds = list(per_seed.values())
    for s in seeds:
        s["share_error"] = {name: share_error(s[f"share {name}"]["tokens_by_tenant"], pair)
                            for name, pair in SHARES.items()}
        s["throughput_fair_over_fcfs"] = round(s["fair"]["tokens_per_s"] / s["fcfs"]["tokens_per_s"], 3)
        for phase in ("fcfs", "fair"):
            s[f"light_ttft_{phase}_over_solo"] = round(s[phase]["light_ttft_p95_s"] / s["solo"]["light_ttft_p95_s"], 3)
    rejected: Counter = Counter()
    for s in seeds:
        for phase in PHASES:
            rejected.update(s[phase]["rejected"])
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                   if k not in ("json", "handler", "command")},
        "light_ttft_p95_solo_s": spread([s["solo"]["light_ttft_p95_s"] for s in seeds], 3),
        "light_ttft_p95_fcfs_s": spread([s["fcfs"]["light_ttft_p95_s"] for s in seeds], 3),
        "light_ttft_p95_fair_s": spread([s["fair"]["light_ttft_p95_s"] for s in seeds], 3),
        "light_ttft_fcfs_over_solo": spread([s["light_ttft_fcfs_over_solo"] for s in seeds], 3),
        "light_ttft_fair_over_solo": spread([s["light_ttft_fair_over_solo"] for s in seeds], 3),
        "throughput_fair_over_fcfs": spread([s["throughput_fair_over_fcfs"] for s in seeds], 3),
        "share_error": {name: spread([s["share_error"][name] for s in seeds], 4) for name in SHARES},
        "rejected": dict(sorted(rejected.items())),
        "hung": sum(s[phase]["hung"] for s in seeds for phase in PHASES),
        "seeds": seeds,
    }


def render(result: dict[str, Any]) -> str:
    def cell(node: dict[str, float]) -> str:
        return f"{node['median']} ({node['min']}-{node['max']})"

    lines = ["measure | median (min-max) over seeds", "---|---",
             f"light TTFT p95 alone, s | {cell(result['light_ttft_p95_solo_s'])}",
             f"light TTFT p95 beside the flood, FCFS, s | {cell(result['light_ttft_p95_fcfs_s'])}",
             f"light TTFT p95 beside the flood, fair share, s | {cell(result['light_ttft_p95_fair_s'])}",
             f"tokens/s, fair over FCFS | {cell(result['throughput_fair_over_fcfs'])}",
             *(f"share error, weights {name} | {cell(node)}" for name, node in result["share_error"].items()),
             f"rejected | {result['rejected'] or 'none'}", f"hung | {result['hung']}"]
    return "\n".join(lines)


def run_bench_fairness(args: argparse.Namespace) -> int:
    result = run(args)
    print(render(result))
    if args.json is not None:
        write_json(args.json, result)
    return 0
