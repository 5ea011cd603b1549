"""`streamrag bench gateway`: what the HTTP gateway adds to an Ask.

The same question is asked over gRPC (`Orchestrator.Ask`) and through the gateway (a streamed
chat completion on `streamrag-rag` with the official `openai` client), one after the other, in an
order that alternates from pair to pair. Each question is first asked once untimed, so both timed
calls find the same warm prefix cache. Greedy decoding: both calls generate the same tokens.
Per pair, measured by this client:

    ttft_added_s          gateway TTFT - gRPC TTFT (from the call to the first answer token)
    ttft_added_outside_s  the same, less each request's own TTFT inside the orchestrator (AskDone's
                          ttft_from_question_s; the gateway's `streamrag` extension carries it): what
                          each path adds outside the orchestrator, free of retrieval's and the
                          engine's variance from one call to the next
    per_token_added_s     the mean gap between answer tokens through the gateway - over gRPC

Then, per seed, the locust user class of load_tests/locust_gateway.py (streamed chat
completions on `streamrag-rag`, seeded) runs headless against the gateway, 20 users for 2
minutes (`--locust-users`, `--locust-seconds`; 0 seconds skips it): its request and failure
counts and the TTFT it saw. Last, every replica named by `--inference` (default the stack's
first) must have all its KV blocks free (polled with `GetStats` for up to 60 s: aborted requests
free theirs at the engine's next step).

Each seed (0..N-1) shuffles the questions; the JSON has p50/p99 per seed and, at the top, the
median over seeds with its min-max spread (load_tests/runner.py). Against a running stack with its
gateway (`streamrag up`):

    streamrag bench gateway --json gateway.json

`--api-key` (default `$STREAMRAG_API_KEY`) is sent to both; `--ca` verifies an HTTPS gateway.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from load_tests.runner import add_seeds_arg, positive_int, spread, write_json
from protos import common_pb2, inference_pb2, inference_pb2_grpc, orchestrator_pb2, orchestrator_pb2_grpc
from protos.retrievers import LIVE_RETRIEVERS, RETRIEVER_CHOICES
from servicekit.auth import API_KEY_ENV, bearer_metadata
from servicekit.config import DEFAULT_PORTS
from servicekit.progress import say
from servicekit.stats import percentile

QUESTIONS = Path(__file__).with_name("questions.txt")
RAG_MODEL = "streamrag-rag"


def add_bench_gateway_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gateway", default=f"http://127.0.0.1:{DEFAULT_PORTS['gateway']}", help="the gateway's URL")
    parser.add_argument("--orchestrator", default=f"127.0.0.1:{DEFAULT_PORTS['orchestrator']}",
                        help="the orchestrator the gateway talks to (host:port, plaintext gRPC)")
    parser.add_argument("--retriever", choices=LIVE_RETRIEVERS, default="anns")
    parser.add_argument("--questions", type=positive_int, default=10, help="questions (pairs) per seed")
    parser.add_argument("--questions-file", type=Path, default=QUESTIONS, help="one question per line, # comments")
    parser.add_argument("--max-tokens", type=positive_int, default=32)
    add_seeds_arg(parser, what="seeds: each draws its own questions; medians are reported")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), help=f"API key (default ${API_KEY_ENV})")
    parser.add_argument("--ca", type=Path, default=None, help="CA certificate that signed an HTTPS gateway's")
    parser.add_argument("--locust-users", type=positive_int, default=20, help="locust users per seed")
    parser.add_argument("--locust-seconds", type=int, default=120, help="locust run per seed (0: none)")
    parser.add_argument("--inference", action="append", default=None,
                        help=f"a replica whose KV blocks must all be free afterwards, repeatable (default "
                             f"127.0.0.1:{DEFAULT_PORTS['inference']})")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def read_questions(path: str | Path) -> list[str]:
    lines = (line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _timing(started: float, token_times: list[float], service_ttft_s: float) -> dict[str, float]:
    gaps = [b - a for a, b in itertools.pairwise(token_times)]
    ttft = token_times[0] - started if token_times else float("nan")
    return {"ttft_s": ttft, "per_token_s": statistics.fmean(gaps) if gaps else float("nan"),
            "tokens": len(token_times), "service_ttft_s": service_ttft_s, "outside_s": ttft - service_ttft_s}


class Clients:
    """The two ways in: an orchestrator stub and an OpenAI client on the gateway."""

    def __init__(self, args: argparse.Namespace) -> None:
        import openai

        self.channel = grpc.insecure_channel(args.orchestrator)
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(self.channel)
        http_client = None
        if args.ca is not None:
            import ssl

            http_client = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(args.ca)))
        self.openai = openai.OpenAI(base_url=f"{args.gateway.rstrip('/')}/v1", api_key=args.api_key or "none",
                                    max_retries=0, timeout=600, http_client=http_client)
        self.metadata = bearer_metadata(args.api_key)
        self.retriever, self.max_tokens = args.retriever, args.max_tokens

    def ask_grpc(self, question: str, max_tokens: int | None = None) -> dict[str, float]:
        request = orchestrator_pb2.AskRequest(question=question, retriever=RETRIEVER_CHOICES[self.retriever],
                                              max_tokens=max_tokens or self.max_tokens,
                                              sampling=common_pb2.SamplingParams(temperature=0))
        started, token_times, service_ttft = time.perf_counter(), [], float("nan")
        for response in self.stub.Ask(request, timeout=600, metadata=self.metadata):
            kind = response.event.WhichOneof("kind")
            if kind == "token":
                token_times.append(time.perf_counter())
            elif kind == "done":
                service_ttft = response.event.done.ttft_from_question_s
        return _timing(started, token_times, service_ttft)

    def ask_gateway(self, question: str) -> dict[str, float]:
        started, token_times = time.perf_counter(), []
        stream = self.openai.chat.completions.create(
            model=RAG_MODEL, stream=True, max_tokens=self.max_tokens, temperature=0,
            messages=[{"role": "user", "content": question}], extra_body={"retrieval": {"retriever": self.retriever}})
        service_ttft = float("nan")
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                token_times.append(time.perf_counter())
            if (chunk.model_extra or {}).get("streamrag"):
                service_ttft = chunk.model_extra["streamrag"]["ttft_from_question_s"]
        return _timing(started, token_times, service_ttft)

    def close(self) -> None:
        self.channel.close()


def run_seed(clients: Clients, questions: list[str], seed: int, count: int) -> dict[str, Any]:
    rng = random.Random(seed)
    chosen = rng.sample(questions, min(count, len(questions)))
    pairs = []
    for i, question in enumerate(chosen):
        clients.ask_grpc(question, max_tokens=1)                     # warm the prefix cache for both
        if (i + seed) % 2 == 0:
            grpc_run, gateway_run = clients.ask_grpc(question), clients.ask_gateway(question)
        else:
            gateway_run, grpc_run = clients.ask_gateway(question), clients.ask_grpc(question)
        pairs.append({"question": question, "grpc": grpc_run, "gateway": gateway_run,
                      "ttft_added_s": gateway_run["ttft_s"] - grpc_run["ttft_s"],
                      "ttft_added_outside_s": gateway_run["outside_s"] - grpc_run["outside_s"],
                      "per_token_added_s": gateway_run["per_token_s"] - grpc_run["per_token_s"]})
        say(f"seed {seed} [{i + 1}/{len(chosen)}] TTFT grpc {grpc_run['ttft_s'] * 1000:7.1f} ms, gateway "
            f"{gateway_run['ttft_s'] * 1000:7.1f} ms ({pairs[-1]['ttft_added_s'] * 1000:+.1f} ms)")
    summary: dict[str, Any] = {"seed": seed, "pairs": pairs}
    for key in ("ttft_added_s", "ttft_added_outside_s", "per_token_added_s"):
        values = [p[key] for p in pairs if p[key] == p[key]]         # NaN when an answer had < 2 tokens
        summary[key] = {"p50": percentile(values, 50), "p99": percentile(values, 99)}
    for side in ("grpc", "gateway"):
        summary[f"{side}_ttft_s"] = {"p50": percentile([p[side]["ttft_s"] for p in pairs], 50)}
    return summary


LOCUSTFILE = Path(__file__).with_name("locust_gateway.py")
KV_FREE_WAIT_S = 60.0


def run_locust(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The locust user class headless against the gateway; its counts and TTFT from locust's CSV."""
    with tempfile.TemporaryDirectory(prefix="streamrag-locust-") as out:
        prefix = Path(out) / "gateway"
        command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
                   "-u", str(args.locust_users), "-r", str(args.locust_users), "-t", f"{args.locust_seconds}s",
                   "--host", args.gateway, "--csv", str(prefix), "--chat-seed", str(seed),
                   "--chat-retriever", args.retriever, "--chat-max-tokens", str(args.max_tokens)]
        env = {**os.environ, "LOCUST_CHAT_API_KEY": args.api_key or ""}
        say(f"seed {seed}: locust, {args.locust_users} users for {args.locust_seconds} s")
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.locust_seconds + 300)
        stats = Path(f"{prefix}_stats.csv")
        rows = {row["Name"]: row for row in csv.DictReader(stats.read_text().splitlines())} if stats.is_file() else {}
    total, ttft = rows.get("chat stream total", {}), rows.get("chat stream TTFT", {})
    result = {"users": args.locust_users, "seconds": args.locust_seconds, "exit_code": done.returncode,
              "requests": int(total.get("Request Count", 0)), "failures": int(total.get("Failure Count", 0)),
              "ttft_ms": {q: float(ttft[key]) if ttft.get(key, "N/A") != "N/A" else None
                          for q, key in (("p50", "50%"), ("p99", "99%"))} if ttft else None}
    if not rows:
        result["error"] = (done.stdout + done.stderr)[-2000:]
    say(f"seed {seed}: locust {result['requests']} requests, {result['failures']} failures")
    return result


def kv_blocks_after(addresses: list[str]) -> dict[str, Any]:
    """Per replica its pools' free/total blocks once every block is free (or after KV_FREE_WAIT_S)."""
    replicas = {}
    for address in addresses:
        with grpc.insecure_channel(address) as channel:
            stub, deadline = inference_pb2_grpc.InferenceStub(channel), time.monotonic() + KV_FREE_WAIT_S
            while True:
                stats = stub.GetStats(inference_pb2.GetStatsRequest(), timeout=30).stats
                free = all(pool.free_blocks == pool.total_blocks for pool in stats.pools) and stats.num_active == 0
                if free or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        replicas[address] = {"all_free": free, "active": stats.num_active,
                             "pools": [{"free": pool.free_blocks, "total": pool.total_blocks} for pool in stats.pools]}
    return {"all_free": all(r["all_free"] for r in replicas.values()), "replicas": replicas}


def run_bench_gateway(args: argparse.Namespace) -> int:
    questions = read_questions(args.questions_file)
    if not questions:
        say(f"error: no questions in {args.questions_file}")
        return 2
    clients = Clients(args)
    replicas = args.inference or [f"127.0.0.1:{DEFAULT_PORTS['inference']}"]
    try:
        runs = []
        for seed in args.seeds:
            run = run_seed(clients, questions, seed, args.questions)
            if args.locust_seconds > 0:
                run["locust"] = run_locust(args, seed)
            run["kv_blocks_after"] = kv_blocks_after(replicas)
            runs.append(run)
    except grpc.RpcError as exc:
        say(f"error: the orchestrator at {args.orchestrator}: {exc.code().name}: {exc.details()}")
        return 1
    except Exception as exc:     # the openai client's connection and status errors
        say(f"error: the gateway at {args.gateway}: {type(exc).__name__}: {exc}")
        return 1
    finally:
        clients.close()
    result: dict[str, Any] = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "gateway": args.gateway, "orchestrator": args.orchestrator, "retriever": args.retriever,
        "questions_per_seed": args.questions, "max_tokens": args.max_tokens, "seeds": args.seeds}
    for key in ("ttft_added_s", "ttft_added_outside_s", "per_token_added_s"):
        result[key] = {q: spread([run[key][q] for run in runs]) for q in ("p50", "p99")}
    for key in ("grpc_ttft_s", "gateway_ttft_s"):
        result[key] = {"p50": spread([run[key]["p50"] for run in runs])}
    if args.locust_seconds > 0:
        locust = [run["locust"] for run in runs]
        result["locust"] = {"users": args.locust_users, "seconds": args.locust_seconds,
                            "requests": sum(r["requests"] for r in locust),
                            "failures": sum(r["failures"] for r in locust),
                            "ttft_ms": {q: spread([r["ttft_ms"][q] for r in locust if r["ttft_ms"]])
                                        for q in ("p50", "p99")} if all(r["ttft_ms"] for r in locust) else None}
    result["kv_blocks_all_free"] = all(run["kv_blocks_after"]["all_free"] for run in runs)
    result["runs"] = runs
    print(f"{'quantity':28s} {'p50 (median of seeds)':>22s} {'p99 (median of seeds)':>22s}")
    for key, label in (("ttft_added_s", "TTFT added by the gateway"),
                       ("ttft_added_outside_s", "  outside the orchestrator"),
                       ("per_token_added_s", "per-token overhead")):
        p50, p99 = (result[key][q]["median"] * 1000 for q in ("p50", "p99"))
        print(f"{label:28s} {p50:19.2f} ms {p99:19.2f} ms")
    print(f"TTFT p50 over gRPC {result['grpc_ttft_s']['p50']['median'] * 1000:.2f} ms, through the gateway "
          f"{result['gateway_ttft_s']['p50']['median'] * 1000:.2f} ms")
    if "locust" in result:
        print(f"locust: {result['locust']['users']} users x {result['locust']['seconds']} s x {len(args.seeds)} seeds: "
              f"{result['locust']['requests']} requests, {result['locust']['failures']} failures")
    print(f"KV blocks all free afterwards: {'yes' if result['kv_blocks_all_free'] else 'NO'}")
    if args.json is not None:
        write_json(args.json, result)
    return 0
