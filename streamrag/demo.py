"""`streamrag demo`: bring the local stack up if needed, ask one question about the Python
documentation twice — streaming, then the non-streaming baseline — and print both latencies.

The two runs are made comparable:

- **The same retrieval.** The demo retrieves once, from the stack's own retrievers, and
  records what arrived and when (`<run-dir>/demo/retrieval.jsonl`, the trace format of
  `streamrag trace record`). A replay retriever on the stack's replay address then serves that
  recording to both runs (`RETRIEVER_CHOICE_REPLAY`): the same chunks at the same offsets,
  so neither run waits on a slower retrieval than the other.
- **A cold cache for each.** Before each run every inference replica is restarted (an empty
  prefix cache) and warmed with an unrelated prompt that shares no KV block with the demo's,
  so the baseline does not reuse the KV the streamed run computed. `--keep-cache` skips the
  restarts: then the baseline runs warm, and the table says so. The prefix-cache hits of each
  run are printed either way.

The crawler's corpus server runs with the `web` latency profile here (inter-page gaps like
the paper's crawler), so retrieval takes seconds and the streamed prefill has something to
overlap with.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import grpc

from protos import common_pb2, inference_pb2, inference_pb2_grpc, orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.auth import keyed_channel
from streamrag.ask import source_line, unique_sources

DEFAULT_QUESTION = "How do I read a file line by line in Python?"
QUERY_ID = "demo"
RETRIEVERS = {"anns": ["anns"], "crawler": ["crawler"], "both": ["anns", "crawler"]}


def add_demo_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--question", default=DEFAULT_QUESTION)
    parser.add_argument("--retriever", choices=list(RETRIEVERS), default="both")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--latency", default="web", help="corpus server latency profile if the demo starts the stack")
    parser.add_argument("--keep-cache", action="store_true",
                        help="do not restart the replicas before each run (faster; the baseline then runs warm)")
    parser.add_argument("--run-dir", type=Path, default=None, help="the local stack's run directory")


def ensure_stack(args: argparse.Namespace):
    """Start the stack unless it runs; returns its recorded state."""
    from streamrag.stack import StackOptions, up
    from streamrag.stack.state import read_state, resolve_run_dir

    options = StackOptions(latency=args.latency, run_dir=args.run_dir)
    if up(options) != 0:
        raise SystemExit("error: the local stack did not come up (see the messages above)")
    state = read_state(resolve_run_dir(args.run_dir))
    if state is None:
        raise SystemExit("error: the local stack is not recorded after `up`")
    return state


# ---------------------------------------------------------------- record once

async def record_retrieval(targets: dict[str, str], question: str):
    """Retrieve once from each retriever at the same time, as the orchestrator would; returns one
    trace query: every chunk in arrival order, with its arrival time, the last one final."""
    from orchestrator.ask import DEFAULT_DEADLINE_MS, DEFAULT_TOP_K
    from protos import retriever_pb2, retriever_pb2_grpc
    from retriever_svc.replay.record import chunk_from_proto
    from retriever_svc.replay.trace import TraceQuery, check_query
    from servicekit.server import MAX_MESSAGE_BYTES

    started = time.monotonic()
    arrived = []

    async def one(name: str, address: str) -> None:
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            request = retriever_pb2.RetrieveRequest(query=question, top_k=DEFAULT_TOP_K,
                                                    deadline_ms=DEFAULT_DEADLINE_MS, request_id=f"demo-record-{name}")
            async for response in retriever_pb2_grpc.RetrieverStub(channel).Retrieve(
                    request, timeout=DEFAULT_DEADLINE_MS / 1000 + 5):
                arrived.append(chunk_from_proto(response.chunk, time.monotonic() - started))
                print(f"  [{time.monotonic() - started:5.2f}s] {name}: chunk {len(arrived)} "
                      f"({len(response.chunk.documents)} documents)", flush=True)

    async def one_or_skip(name: str, address: str) -> None:
        try:
            await one(name, address)
        except grpc.aio.AioRpcError as exc:      # e.g. the ANNS index still building on a fresh machine
            if exc.code() != grpc.StatusCode.UNAVAILABLE or len(targets) == 1:
                raise
            print(f"  {name} cannot answer yet ({exc.details()}): the demo goes on with the others", flush=True)

    await asyncio.gather(*(one_or_skip(name, address) for name, address in targets.items()))
    if not arrived:
        raise SystemExit("error: the retrievers sent nothing to record")
    arrived.sort(key=lambda chunk: chunk.t_s)
    chunks = [replace(chunk, final=False) for chunk in arrived[:-1]] + [replace(arrived[-1], final=True)]
    query = TraceQuery(QUERY_ID, question, "+".join(targets), "recorded", tuple(chunks))
    check_query(query)
    return query


def start_replay(trace: Path, target: str, log: Path) -> subprocess.Popen:
    """A replay retriever serving `trace` where the stack's orchestrator expects one."""
    from servicekit.health import check_health
    from streamrag.stack.plan import CLI
    from streamrag.stack.processes import child_env

    host, port = target.rsplit(":", 1)
    with open(log, "wb") as out:
        proc = subprocess.Popen([*CLI, "serve", "retriever", "--kind", "replay", "--trace", str(trace),
                                 "--host", host, "--port", port, "--metrics-port", "-1"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env())
    deadline = time.monotonic() + 120
    while (reason := check_health("grpc", target, 2.0)) is not None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"error: the replay retriever did not start on {target} ({reason}); see {log}")
        time.sleep(0.25)
    return proc


# ---------------------------------------------------------------- a cold cache for each run

def fresh_replicas(run_dir: Path | None, replicas: list[str]) -> None:
    """Restart every replica (empty prefix cache) and warm each with a prompt unrelated to the demo's."""
    from streamrag.stack.commands import restart
    from streamrag.stack.plan import StackError
    from streamrag.stack.state import read_stack

    t0 = time.monotonic()
    try:
        restart(run_dir, replicas)
    except StackError as exc:
        raise SystemExit(f"error: restarting {exc.service} failed: {exc.reason}") from None
    _, services = read_stack(run_dir)
    for service in services:
        if service.name in replicas:
            with grpc.insecure_channel(service.target) as channel:
                request = inference_pb2.GenerateRequest(
                    request_id=f"demo-warm-up-{uuid.uuid4().hex[:8]}", segments=[common_pb2.Segment(text="Warm-up.")],
                    sampling=common_pb2.SamplingParams(max_tokens=2))
                for _ in inference_pb2_grpc.InferenceStub(channel).Generate(request, timeout=300):
                    pass
    print(f"  restarted {', '.join(replicas)} (empty prefix cache) in {time.monotonic() - t0:.1f} s", flush=True)


# ---------------------------------------------------------------- ask twice

def ask(stub, args: argparse.Namespace, streaming: bool, deadline_ms: int) -> orchestrator_pb2.AskDone:
    label = "streaming" if streaming else "non-streaming (baseline)"
    print(f"\n--- {label} ---", flush=True)
    request = orchestrator_pb2.AskRequest(question=args.question, retriever=orchestrator_pb2.RETRIEVER_CHOICE_REPLAY,
                                          no_stream=not streaming, max_tokens=args.max_tokens,
                                          retrieval_deadline_ms=deadline_ms, retriever_options={"query_id": QUERY_ID})
    patience = time.monotonic() + 60
    while True:
        try:
            return stream_answer(stub, request)
        except NotRoutedYet:
            # Right after a restart the orchestrator may not have polled the replica yet: it refuses
            # before anything is retrieved or computed, so asking again is the same run.
            if time.monotonic() > patience:
                raise SystemExit("error: the orchestrator found no inference replica for 60 s") from None
            time.sleep(1.0)


class NotRoutedYet(Exception):
    """The Ask was refused before it started (no replica available)."""


def stream_answer(stub, request: orchestrator_pb2.AskRequest) -> orchestrator_pb2.AskDone:
    started = time.monotonic()
    chunks = 0
    done = None
    responses = stub.Ask(request, timeout=600)
    try:
        first = next(responses)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            raise NotRoutedYet() from exc
        raise
    except StopIteration:
        raise SystemExit("error: the answer ended without a result") from None
    for response in itertools.chain([first], responses):
        event = response.event
        kind = event.WhichOneof("kind")
        if kind == "retrieval":
            chunks += 1
            print(f"  [{time.monotonic() - started:5.2f}s] retrieved chunk {chunks} (replayed; "
                  f"{event.retrieval.num_documents} documents in the prompt)", flush=True)
        elif kind == "token":
            if event.token.index == 0:
                print(f"  [{time.monotonic() - started:5.2f}s] first token\n", flush=True)
            sys.stdout.write(event.token.text)
            sys.stdout.flush()
        elif kind == "done":
            done = event.done
    print()
    if done is None:
        raise SystemExit("error: the answer ended without a result")
    return done


def print_comparison(streamed: orchestrator_pb2.AskDone, baseline: orchestrator_pb2.AskDone, cold: bool) -> None:
    print("\nSources:")
    for source, passages in unique_sources(streamed.sources)[:8]:
        print(source_line(source, passages))
    print(f"\n{'':28s}{'streaming':>12s}{'non-streaming':>16s}")
    rows = [("retrieval time (replayed)", streamed.retrieval_s, baseline.retrieval_s),
            ("TTFT from the question", streamed.ttft_from_question_s, baseline.ttft_from_question_s),
            ("TTFT after retrieval", streamed.ttft_from_retrieval_end_s, baseline.ttft_from_retrieval_end_s)]
    for name, a, b in rows:
        print(f"{name:28s}{a:11.2f}s{b:15.2f}s")
    print(f"{'prompt tokens':28s}{streamed.stats.prompt_tokens:12d}{baseline.stats.prompt_tokens:16d}")
    print(f"{'prefix-cache hit tokens':28s}{streamed.stats.prefix_cache_hit_tokens:12d}"
          f"{baseline.stats.prefix_cache_hit_tokens:16d}")
    if cold:
        print("\nBoth runs replayed the same recorded retrieval, each on a freshly restarted replica "
              "(no KV shared between them).")
    else:
        print("\nBoth runs replayed the same recorded retrieval. --keep-cache: the non-streaming run is WARM "
              "(it reuses the prefix-cache KV of the streamed run's prompt), so its TTFT flatters the baseline.")
    if cold and streamed.ttft_from_retrieval_end_s > 0:
        ratio = baseline.ttft_from_retrieval_end_s / streamed.ttft_from_retrieval_end_s
        print(f"After retrieval ends, the streamed prompt answers {ratio:.1f}x sooner "
              f"(its context was prefilled while documents arrived).")
    print("The stack keeps running: `streamrag ask \"...\"`, `streamrag status`, `streamrag down`.")


def run_demo(args: argparse.Namespace) -> int:
    from retriever_svc.replay.trace import TraceHeader, write_trace
    from streamrag.stack.plan import replay_target
    from streamrag.stack.state import log_path, resolve_run_dir, use_stack_key

    state = ensure_stack(args)
    use_stack_key(args.run_dir)                 # the stack may have just made its key
    run_dir = resolve_run_dir(args.run_dir)
    services = {s.name: s for s in state.services}
    replay = replay_target(state.services)
    if replay is None:
        print("error: this stack's orchestrator has no replay retriever (it was started by an older streamrag): "
              "`streamrag down`, then `streamrag up`", file=sys.stderr)
        return 1
    orchestrator = services["orchestrator"].target
    replicas = [s.name for s in state.services if s.kind == "inference"]
    print(f"\nQuestion: {args.question}\nOrchestrator: {orchestrator}, retriever: {args.retriever}")

    print(f"\n--- retrieving once from {args.retriever}, recording what arrives and when ---", flush=True)
    query = asyncio.run(record_retrieval({name: services[name].target for name in RETRIEVERS[args.retriever]},
                                         args.question))
    trace = run_dir / "demo" / "retrieval.jsonl"
    trace.parent.mkdir(exist_ok=True)
    write_trace(trace, [query], TraceHeader(generator="streamrag demo"))
    print(f"  recorded {len(query.chunks)} chunks over {query.duration_s:.2f} s into {trace}; both runs replay it")
    deadline_ms = int(max(20.0, query.duration_s + 5.0) * 1000)     # the same for both runs, past the last chunk

    replay_proc = start_replay(trace, replay, log_path(run_dir, "demo-replay"))
    try:
        with keyed_channel(orchestrator) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
            results = {}
            for streaming in (True, False):
                if not args.keep_cache:
                    fresh_replicas(args.run_dir, replicas)
                results[streaming] = ask(stub, args, streaming, deadline_ms)
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        replay_proc.terminate()
        try:
            replay_proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            replay_proc.kill()
            replay_proc.wait()
    print_comparison(results[True], results[False], cold=not args.keep_cache)
    return 0
