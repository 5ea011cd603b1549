"""`streamrag bench fairness`: two tenants on one replica, with fair share off and on.

Two local stacks at once, each a private Redis, one native replica (fp32, policy fcfs, `--max-running`
small so that a flood queues) and an orchestrator with a tenants file, each its own process: one
replica started with `--fair-share off` (plain FCFS), the other `on` (engine/fair_share.py). The
clients are the orchestrator's `Inference.Generate` callers (plain prompts of random token ids,
greedy, `--max-tokens`), each with its tenant's key:

- tenant `light`: one user with `--think-s` between asks;
- tenant `flood`: `--flood-users` users with no think time.

Per seed, in one go:

1. `solo`: light alone, `--duration` seconds;
2. `fcfs` and `fair`: light beside the flood, on the FCFS stack and on the fair one, in four rounds of
   half `--duration` each, ABBA (fcfs, fair, fair, fcfs; BAAB on odd seeds), so that a change in what
   else the machine runs falls on both alike (runs minutes apart on a shared machine differed by more
   than fair share does);
3. `share 1:1`, `share 3:1`: two flooding tenants (weights 1 and 1, then 3 and 1), both backlogged: each
   one's share of the served tokens (prompt + generated of the answers completed in the window) against
   its weight's.

Every tenant has `max_queue_s` = `--max-queue-s`: a request that cannot start in time is answered
UNAVAILABLE (the gateway's 503) instead of waiting. An ask is `hung` when it got neither its first token
nor an error within `max_queue_s` + 5 s. The JSON has, per seed and as the median over seeds (with
min-max, load_tests/runner.py): `light_ttft_p95_solo_s`, `light_ttft_p95_fcfs_s`, `light_ttft_p95_fair_s`,
`throughput_fair_over_fcfs` (prompt + generated tokens of every answer, per second from each round's
first ask to its last answer, summed over the rounds), `share_error` (per weight setting: the largest
relative gap between a tenant's share and its weight's), `rejected` (by tenant and status) and `hung`.
Each phase also has `engine`: the replica's own counts over it (steps, tokens per step, prompt tokens
computed against those of the answers, preemptions, aborted requests), which tell a scheduling
difference from the machine's noise.

Two more phases, each its own option, on the fair stack:

- `--overload`: tenant `overload` (`max_queue_s` = `--overload-queue-s`, small) is sent Poisson arrivals
  at `--overload-x` (5) times the answers per second the stack gave in the loaded fair rounds, for
  `--overload-s` seconds, through a gateway with the official `openai` client (streamed completions,
  its timeout well past `max_queue_s` + 5 s): `overload` has the asks answered, refused (by status,
  with or without `Retry-After`), `hung` (neither a first token nor a refusal within `max_queue_s` + 5 s)
  and the seconds to each 503 (p50, p95, max) against `max_queue_s`;
- `--fleet`: a second orchestrator on the same Redis and replica, a gateway in front of each, and tenant
  `fleet` with `requests_per_minute` = `--fleet-rpm`, hammered by `--fleet-users` clients in turn through
  both gateways for `--fleet-s` seconds: `fleet` has the requests admitted and refused 429, the rate
  admitted past the bucket's first fill (which holds one minute's requests), per minute, and
  `fleet_limit_rate_error`, its relative gap to the configured rate.

    streamrag bench fairness --json fairness.json --seeds 0,1,2 --overload --fleet
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
STACK_KEY = "key-fairness-stack"
SHARES = {"1:1": (("flood", 1.0), ("second", 1.0)), "3:1": (("heavy", 3.0), ("flood", 1.0))}
PHASES = ("solo", "fcfs", "fair", *(f"share {name}" for name in SHARES))
ENGINE_COUNTERS = ("steps", "prompt_tokens_computed", "generated_tokens", "preemptions_swap", "preemptions_recompute",
                   "requests_aborted")
WORDS = ("river", "stone", "light", "paper", "window", "garden", "engine", "signal", "market", "winter", "orange",
         "number", "travel", "silver", "music", "forest", "letter", "bridge", "circle", "yellow")


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
    parser.add_argument("--overload", action="store_true",
                        help="also drive --overload-x times the stack's capacity through a gateway (openai client)")
    parser.add_argument("--overload-x", type=positive_float, default=5.0, help="the overload, times the capacity")
    parser.add_argument("--overload-s", type=positive_float, default=45.0, help="seconds the overload sends")
    parser.add_argument("--overload-queue-s", type=positive_float, default=10.0,
                        help="the overloading tenant's max_queue_s")
    parser.add_argument("--fleet", action="store_true",
                        help="also hammer one rate limit through two gateways and two orchestrators")
    parser.add_argument("--fleet-rpm", type=positive_int, default=120, help="the fleet tenant's requests_per_minute")
    parser.add_argument("--fleet-s", type=positive_float, default=60.0, help="seconds the fleet phase sends")
    parser.add_argument("--fleet-users", type=positive_int, default=8, help="clients hammering the limit")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tenants_file(directory: Path, args: argparse.Namespace) -> Path:
    names = {"light": 1.0, "flood": 1.0, "second": 1.0, "heavy": 3.0}
    path = directory / "tenants.toml"
    path.write_text("".join(f'[tenants.{name}]\nkeys = ["key-{name}"]\nweight = {weight}\n'
                            f'max_queue_s = {args.max_queue_s}\n\n' for name, weight in names.items())
                    + f'[tenants.overload]\nkeys = ["key-overload"]\nmax_queue_s = {args.overload_queue_s}\n\n'
                    + f'[tenants.fleet]\nkeys = ["key-fleet"]\nrequests_per_minute = {args.fleet_rpm}\n')
    return path


# ---------------------------------------------------------------------------- the stack

@dataclass
class Stack:
    """Redis, one replica, orchestrators and gateways, as processes; `stop()` ends them all."""

    workdir: Path
    name: str
    processes: list[subprocess.Popen] = field(default_factory=list)
    replica: Any = None
    redis_url: str = ""
    tenants: Path | None = None

    def _wait(self, check: str, target: str, what: str, process: subprocess.Popen, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while (reason := check_health(check, target, 2.0)) is not None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start ({reason}); see {self.workdir}")
            time.sleep(0.2)

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.workdir / log_name, "a")   # noqa: SIM115 - the process's, closed by the OS
        # the stack's own key: a gateway presents it and names the caller's tenant, which the orchestrator trusts
        process = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "STREAMRAG_API_KEY": STACK_KEY})
        self.processes.append(process)
        return process

    def start(self, args: argparse.Namespace, fair: bool) -> str:
        """Start Redis, the replica (fair share on or off) and an orchestrator; the orchestrator's address."""
        redis_port = free_port()
        redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--bind",
                                  "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.processes.append(redis)
        self.redis_url = f"redis://127.0.0.1:{redis_port}/0"
        self._wait("redis", self.redis_url, "redis", redis)
        from inference_svc.launch import start_inference_service

        self.replica = start_inference_service(
            "native", args.model, policy="fcfs", dtype="float32", metrics_port=-1,
            extra_args=["--fair-share", "on" if fair else "off", "--max-running", str(args.max_running)],
            log_path=self.workdir / f"inference-{self.name}.log")
        self.tenants = tenants_file(self.workdir, args)
        return self.add_orchestrator()

    def add_orchestrator(self) -> str:
        """One more orchestrator on this stack's Redis and replica; its address."""
        port = free_port()
        process = self._spawn(["-m", "orchestrator.server", "--host", "127.0.0.1", "--port", str(port),
                               "--metrics-port", "-1", "--redis", self.redis_url, "--inference", self.replica.address,
                               "--anns", "", "--crawler", "", "--tenants", str(self.tenants),
                               "--log-level", "WARNING"], f"orchestrator-{self.name}-{port}.log")
        address = f"127.0.0.1:{port}"
        self._wait("grpc", address, "the orchestrator", process)
        return address

    def add_gateway(self, orchestrator: str) -> str:
        """A gateway in front of `orchestrator`, with the tenants file; its base URL."""
        port = free_port()
        process = self._spawn(["-m", "streamrag.cli", "serve", "gateway", "--host", "127.0.0.1", "--port", str(port),
                               "--orchestrator", orchestrator, "--tenants", str(self.tenants),
                               "--log-level", "WARNING"], f"gateway-{self.name}-{port}.log")
        url = f"http://127.0.0.1:{port}"
        self._wait("http", f"{url}/health", "the gateway", process)
        return url

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


async def engine_counters(replica: str) -> dict[str, int]:
    async with grpc.aio.insecure_channel(replica) as channel:
        stats = (await inference_pb2_grpc.InferenceStub(channel).GetStats(inference_pb2.GetStatsRequest(),
                                                                           timeout=30)).stats
    return {name: getattr(stats.counters, name) for name in ENGINE_COUNTERS}


# ---------------------------------------------------------------------------- the load

@dataclass
class Ask:
    tenant: str
    sent: float
    first_token: float | None = None
    ended: float | None = None
    status: str = ""              # "ok" or the gRPC status name
    prompt_tokens: int = 0        # when answered
    generated_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens


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
                record.prompt_tokens, record.generated_tokens = stats.prompt_tokens, stats.generated_tokens
                record.status = "ok"
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


@dataclass
class Round:
    """One run of users against one stack: its asks, when sending started and stopped, the replica's counts."""

    asks: list[Ask]
    started: float
    until: float
    engine: dict[str, int]


async def run_round(stack: Stack, address: str, users: list[tuple[str, float]], args: argparse.Namespace,
                    seed: str, duration: float) -> Round:
    """`users`: (tenant, think time) each, for `duration` seconds. `seed` names the phase: each phase's
    prompts are its own, so none is served from the prefix cache a phase before it filled (a tenant would
    be served tokens its counter was never charged for, and the shares would not be the scheduler's)."""
    asks: list[Ask] = []
    before = await engine_counters(stack.replica.address)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        started = time.monotonic()
        until = started + duration
        tasks = [asyncio.create_task(user(stub, tenant, random.Random(f"{seed}-{i}"), args, until, think, asks))
                 for i, (tenant, think) in enumerate(users)]
        # the last asks get their answer or refusal; past max_queue_s + the grace they count as hung
        _, pending = await asyncio.wait(tasks, timeout=duration + args.max_queue_s + HANG_GRACE_S + 120)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    after = await engine_counters(stack.replica.address)
    return Round(asks, started, until, {k: after[k] - before[k] for k in ENGINE_COUNTERS})


def hung_ask(a: Ask, max_queue_s: float) -> bool:
    """Neither a first token nor an error within `max_queue_s` + the grace (or never)."""
    answered_at = a.first_token if a.first_token is not None else a.ended if a.status not in ("", "ok") else None
    return answered_at is None or answered_at - a.sent > max_queue_s + HANG_GRACE_S


def engine_summary(rounds: list[Round], answered: list[Ask]) -> dict[str, Any]:
    counts = Counter()
    for r in rounds:
        counts.update(r.engine)
    steps = counts["steps"] or 1
    return {"steps": counts["steps"],
            "tokens_per_step": round((counts["prompt_tokens_computed"] + counts["generated_tokens"]) / steps, 2),
            "prompt_tokens_computed": counts["prompt_tokens_computed"],
            "prompt_tokens_answered": sum(a.prompt_tokens for a in answered),
            "generated_tokens": counts["generated_tokens"],
            "preemptions": counts["preemptions_swap"] + counts["preemptions_recompute"],
            "aborted": counts["requests_aborted"]}


def summarize(rounds: list[Round], max_queue_s: float) -> dict[str, Any]:
    asks = [a for r in rounds for a in r.asks]
    light = [a.first_token - a.sent for a in asks if a.tenant == "light" and a.first_token is not None]
    answered = [a for a in asks if a.status == "ok" and a.ended is not None]
    tokens = Counter()                     # served while every tenant was backlogged: answers ended in the window
    served_s = 0.0
    for r in rounds:
        ended = [a.ended for a in r.asks if a.status == "ok" and a.ended is not None]
        served_s += max(ended, default=r.until) - r.started
        for a in r.asks:
            if a.status == "ok" and a.ended is not None and a.ended <= r.until:
                tokens[a.tenant] += a.tokens
    rejected = Counter(f"{a.tenant}/{a.status}" for a in asks if a.status not in ("ok", "", "CANCELLED"))
    hung = sum(1 for a in asks if hung_ask(a, max_queue_s))
    return {"light_ttft_p95_s": round(percentile(light, 95), 3) if light else None,
            "light_ttft_p50_s": round(percentile(light, 50), 3) if light else None,
            "light_asks": len(light), "asks": len(asks), "tokens_by_tenant": dict(tokens),
            "tokens_per_s": round(sum(a.tokens for a in answered) / served_s, 1),   # every answer
            "rejected": dict(rejected), "hung": hung, "engine": engine_summary(rounds, answered)}


def share_error(tokens: dict[str, int], weights: tuple[tuple[str, float], ...]) -> float:
    total, weight_sum = sum(tokens.get(t, 0) for t, _ in weights), sum(w for _, w in weights)
    if not total:
        return float("nan")
    return round(max(abs(tokens.get(t, 0) / total - w / weight_sum) / (w / weight_sum) for t, w in weights), 4)


# ---------------------------------------------------------------------------- overload and the fleet

@dataclass
class HttpAsk:
    sent: float
    first_token: float | None = None
    ended: float | None = None
    status: str = ""              # "ok", the HTTP status ("429", "503", ...) or "timeout"
    retry_after: bool = False


def prompt_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def http_ask(client, model: str, prompt: str, max_tokens: int, asks: list[HttpAsk]) -> None:
    """One streamed completion through the gateway with the official `openai` client."""
    import openai

    record = HttpAsk(time.monotonic())
    asks.append(record)
    try:
        stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True)
        async for _ in stream:
            if record.first_token is None:
                record.first_token = time.monotonic()
        record.status = "ok"
    except openai.APIStatusError as exc:
        record.status = str(exc.status_code)
        record.retry_after = "retry-after" in exc.response.headers
    except openai.APITimeoutError:
        record.status = "timeout"
    except openai.APIError as exc:
        record.status = type(exc).__name__
    finally:
        record.ended = time.monotonic()


def _openai_client(base_url: str, key: str, timeout_s: float):
    import openai

    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=timeout_s)


async def served_model(replica: str) -> str:
    async with grpc.aio.insecure_channel(replica) as channel:
        described = await inference_pb2_grpc.InferenceStub(channel).Describe(inference_pb2.DescribeRequest(),
                                                                              timeout=30)
    return described.model_info.model


async def drive_overload(gateway: str, model: str, rate_per_s: float, args: argparse.Namespace) -> list[HttpAsk]:
    """Poisson arrivals at `rate_per_s` for `--overload-s`, each a streamed completion of tenant `overload`."""
    rng = random.Random("overload")
    bound = args.overload_queue_s + HANG_GRACE_S
    client = _openai_client(gateway, "key-overload", timeout_s=bound + 60)   # well past what a refusal may take
    asks: list[HttpAsk] = []
    tasks = []
    until = time.monotonic() + args.overload_s
    while (now := time.monotonic()) < until:
        tasks.append(asyncio.create_task(http_ask(client, model, prompt_text(rng, args.prompt_tokens),
                                                  args.max_tokens, asks)))
        await asyncio.sleep(max(0.0, min(rng.expovariate(rate_per_s), until - now)))
    await asyncio.gather(*tasks)
    await client.close()
    return asks


def overload_summary(asks: list[HttpAsk], rate_per_s: float, capacity_per_s: float,
                     args: argparse.Namespace) -> dict[str, Any]:
    bound = args.overload_queue_s + HANG_GRACE_S

    def hung(a: HttpAsk) -> bool:
        at = a.first_token if a.status == "ok" else a.ended if a.status not in ("", "timeout") else None
        return at is None or at - a.sent > bound

    to_503 = [a.ended - a.sent for a in asks if a.status == "503"]
    refused = [a for a in asks if a.status in ("429", "503")]
    return {"capacity_asks_per_s": round(capacity_per_s, 3), "rate_asks_per_s": round(rate_per_s, 3),
            "max_queue_s": args.overload_queue_s, "asks": len(asks),
            "answered": sum(1 for a in asks if a.status == "ok"),
            "by_status": dict(sorted(Counter(a.status for a in asks).items())),
            "refused_without_retry_after": sum(1 for a in refused if not a.retry_after),
            "hung": sum(1 for a in asks if hung(a)),
            "time_to_503_s": ({"p50": round(percentile(to_503, 50), 2), "p95": round(percentile(to_503, 95), 2),
                               "max": round(max(to_503), 2)} if to_503 else None)}


async def hammer_fleet(gateways: list[str], model: str, args: argparse.Namespace) -> tuple[list[HttpAsk], float]:
    """`--fleet-users` clients, each in turn through the gateways, one-token completions of tenant `fleet`."""
    clients = [_openai_client(g, "key-fleet", timeout_s=120) for g in gateways]
    asks: list[HttpAsk] = []
    started = time.monotonic()
    until = started + args.fleet_s

    async def one(i: int) -> None:
        n = i
        while time.monotonic() < until:
            await http_ask(clients[n % len(clients)], model, "Hi", 1, asks)
            n += 1
            if asks[-1].status == "429":
                await asyncio.sleep(0.2)         # a refusal is instant: pace the retries a little

    await asyncio.gather(*(one(i) for i in range(args.fleet_users)))
    elapsed = time.monotonic() - started
    for client in clients:
        await client.close()
    return asks, elapsed


def fleet_summary(asks: list[HttpAsk], elapsed_s: float, rpm: int) -> dict[str, Any]:
    admitted = sum(1 for a in asks if a.status == "ok")
    # the bucket starts full (one minute's requests) and refills at `rpm` a minute: past the first fill, what was
    # admitted over the run's seconds is the enforced rate
    rate = (admitted - rpm) / elapsed_s * 60
    return {"requests_per_minute": rpm, "seconds": round(elapsed_s, 1), "admitted": admitted,
            "refused_429": sum(1 for a in asks if a.status == "429"),
            "other": dict(Counter(a.status for a in asks if a.status not in ("ok", "429"))),
            "admitted_per_minute_past_first_fill": round(rate, 1),
            "fleet_limit_rate_error": round(abs(rate - rpm) / rpm, 4)}


# ---------------------------------------------------------------------------- the bench

def loaded_rounds(stacks: dict[str, tuple[Stack, str]], users: list[tuple[str, float]], args: argparse.Namespace,
                  seed: int) -> dict[str, dict[str, Any]]:
    """The light tenant beside the flood on the FCFS stack and on the fair one: ABBA rounds (BAAB on odd seeds)."""
    order = ("fcfs", "fair", "fair", "fcfs") if seed % 2 == 0 else ("fair", "fcfs", "fcfs", "fair")
    rounds: dict[str, list[Round]] = {"fcfs": [], "fair": []}
    for i, mode in enumerate(order):
        say(f"seed {seed}: {mode}, round {i + 1} of 4 ({len(users)} users, {args.duration / 2:g} s)")
        stack, address = stacks[mode]
        rounds[mode].append(asyncio.run(run_round(stack, address, users, args, f"{seed}-{i}", args.duration / 2)))
    return {mode: summarize(r, args.max_queue_s) | {"answers_per_s": answers_per_s(r)} for mode, r in rounds.items()}


def answers_per_s(rounds: list[Round]) -> float:
    answered = sum(1 for r in rounds for a in r.asks if a.status == "ok")
    served_s = sum(max((a.ended for a in r.asks if a.status == "ok"), default=r.until) - r.started for r in rounds)
    return round(answered / served_s, 3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    per_seed: dict[int, dict[str, Any]] = {seed: {"seed": seed} for seed in args.seeds}
    light = [("light", args.think_s)]
    flood = [("flood", 0.0)] * args.flood_users
    workdir = Path(tempfile.mkdtemp(prefix="streamrag-fairness-"))
    stacks: dict[str, tuple[Stack, str]] = {}
    extra: dict[str, Any] = {}
    try:
        for mode in ("fcfs", "fair"):
            say(f"starting the {mode} stack (fair share {'on' if mode == 'fair' else 'off'}) in {workdir}")
            stack = Stack(workdir, mode)
            stacks[mode] = (stack, "")
            stacks[mode] = (stack, stack.start(args, fair=mode == "fair"))
            asyncio.run(run_round(stack, stacks[mode][1], [("light", 0.0)], args, "warm-up", 5.0))   # not measured
        fair_stack, fair_address = stacks["fair"]
        for seed in args.seeds:
            out = per_seed[seed]
            say(f"seed {seed}: solo (1 user, {args.duration:g} s)")
            out["solo"] = summarize([asyncio.run(run_round(fair_stack, fair_address, light, args, f"{seed}-solo",
                                                           args.duration))], args.max_queue_s)
            out.update(loaded_rounds(stacks, light + flood, args, seed))
            for name, pair in SHARES.items():
                users = [(t, 0.0) for t, _ in pair] * args.flood_users
                say(f"seed {seed}: share {name} ({len(users)} users, {args.duration:g} s)")
                out[f"share {name}"] = summarize([asyncio.run(run_round(fair_stack, fair_address, users, args,
                                                                        f"{seed}-share {name}", args.duration))],
                                                 args.max_queue_s)
        if args.overload:
            capacity = min(s["fair"]["answers_per_s"] for s in per_seed.values())
            rate = args.overload_x * capacity
            say(f"overload: {rate:.2f} asks/s ({args.overload_x:g}x {capacity:.2f}) for {args.overload_s:g} s, "
                f"max_queue_s {args.overload_queue_s:g}")
            gateway = fair_stack.add_gateway(fair_address)
            model = asyncio.run(served_model(fair_stack.replica.address))
            asks = asyncio.run(drive_overload(gateway, model, rate, args))
            extra["overload"] = overload_summary(asks, rate, capacity, args)
        if args.fleet:
            say(f"fleet: {args.fleet_rpm} requests a minute through two gateways and two orchestrators, "
                f"{args.fleet_s:g} s")
            gateways = [fair_stack.add_gateway(fair_address), fair_stack.add_gateway(fair_stack.add_orchestrator())]
            model = asyncio.run(served_model(fair_stack.replica.address))
            extra["fleet"] = fleet_summary(*asyncio.run(hammer_fleet(gateways, model, args)), args.fleet_rpm)
    finally:
        for stack, _ in stacks.values():
            stack.stop()
    seeds = list(per_seed.values())
    for s in seeds:
        s["share_error"] = {name: share_error(s[f"share {name}"]["tokens_by_tenant"], pair)
                            for name, pair in SHARES.items()}
        s["throughput_fair_over_fcfs"] = round(s["fair"]["tokens_per_s"] / s["fcfs"]["tokens_per_s"], 3)
        s["tokens_per_step_fair_over_fcfs"] = round(s["fair"]["engine"]["tokens_per_step"]
                                                    / s["fcfs"]["engine"]["tokens_per_step"], 3)
        for phase in ("fcfs", "fair"):
            s[f"light_ttft_{phase}_over_solo"] = round(s[phase]["light_ttft_p95_s"] / s["solo"]["light_ttft_p95_s"], 3)
    rejected: Counter = Counter()
    for s in seeds:
        for phase in PHASES:
            rejected.update(s[phase]["rejected"])
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                   if k not in ("json", "handler", "command")},
        "light_ttft_p95_solo_s": spread([s["solo"]["light_ttft_p95_s"] for s in seeds], 3),
        "light_ttft_p95_fcfs_s": spread([s["fcfs"]["light_ttft_p95_s"] for s in seeds], 3),
        "light_ttft_p95_fair_s": spread([s["fair"]["light_ttft_p95_s"] for s in seeds], 3),
        "light_ttft_fcfs_over_solo": spread([s["light_ttft_fcfs_over_solo"] for s in seeds], 3),
        "light_ttft_fair_over_solo": spread([s["light_ttft_fair_over_solo"] for s in seeds], 3),
        "throughput_fair_over_fcfs": spread([s["throughput_fair_over_fcfs"] for s in seeds], 3),
        "tokens_per_step_fair_over_fcfs": spread([s["tokens_per_step_fair_over_fcfs"] for s in seeds], 3),
        "share_error": {name: spread([s["share_error"][name] for s in seeds], 4) for name in SHARES},
        "rejected": dict(sorted(rejected.items())),
        "light_shed_fair": sum(s["fair"]["rejected"].get("light/UNAVAILABLE", 0) for s in seeds),
        "hung": sum(s[phase]["hung"] for s in seeds for phase in PHASES),
        **extra,
        "seeds": seeds,
    }
    if "fleet" in extra:
        result["fleet_limit_rate_error"] = extra["fleet"]["fleet_limit_rate_error"]
    return result


def render(result: dict[str, Any]) -> str:
    def cell(node: dict[str, float]) -> str:
        return f"{node['median']} ({node['min']}-{node['max']})"

    lines = ["measure | median (min-max) over seeds", "---|---",
             f"light TTFT p95 alone, s | {cell(result['light_ttft_p95_solo_s'])}",
             f"light TTFT p95 beside the flood, FCFS, s | {cell(result['light_ttft_p95_fcfs_s'])}",
             f"light TTFT p95 beside the flood, fair share, s | {cell(result['light_ttft_p95_fair_s'])}",
             f"tokens/s, fair over FCFS | {cell(result['throughput_fair_over_fcfs'])}",
             *(f"share error, weights {name} | {cell(node)}" for name, node in result["share_error"].items()),
             f"tokens per engine step, fair over FCFS | {cell(result['tokens_per_step_fair_over_fcfs'])}",
             f"rejected | {result['rejected'] or 'none'}", f"hung | {result['hung']}"]
    if "overload" in result:
        o = result["overload"]
        lines += [f"overload ({o['rate_asks_per_s']} asks/s, max_queue_s {o['max_queue_s']:g}) | {o['by_status']}, "
                  f"hung {o['hung']}, to 503 s {o['time_to_503_s']}"]
    if "fleet" in result:
        f = result["fleet"]
        lines += [f"fleet limit ({f['requests_per_minute']} a minute) | admitted "
                  f"{f['admitted_per_minute_past_first_fill']} a minute, error {f['fleet_limit_rate_error']}"]
    return "\n".join(lines)


def run_bench_fairness(args: argparse.Namespace) -> int:
    result = run(args)
    print(render(result))
    if args.json is not None:
        write_json(args.json, result)
    return 0
