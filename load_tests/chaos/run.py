"""`streamrag bench chaos`: start a stack (or attach to one), pass the question set once without
faults, then soak it with users, an ingesting session and the fault schedule; drain, check, report.

    streamrag bench chaos --duration 10m --users 10 --json /tmp/chaos.json
    streamrag bench chaos --run-dir RUN --duration 2m --faults kill:inference-0,stop:inference-1

Without a stack in --run-dir it starts one there (`streamrag up --free-ports`, fp32 so greedy
answers compare exactly, two replicas so a frozen one can be failed over, two orchestrators so
asks outlive the one a fault hits, the Python tutorial as the corpus) and stops it at the end
(`--keep-up` leaves it). Users ask as `streamrag ask` does (workload.Clients: every orchestrator,
the broken Ask resumed). `soak()` is the same run on any stack
(tests pass a compose project).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from load_tests.runner import positive_int, write_json

TUTORIAL = Path("/usr/share/doc/python3.11/html/tutorial")


def duration(text: str) -> float:
    """"10m", "90s", "1h", "45" (seconds) -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"must be a duration like 90s, 10m or 1h, got {text!r}")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def think_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        lo = hi = -1.0
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"must be MIN,MAX seconds with 0 <= MIN <= MAX, got {text!r}")
    return lo, hi


def fault_list(text: str) -> list[tuple[str, str]]:
    from load_tests.chaos.faults import parse_faults

    try:
        return parse_faults(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_bench_chaos_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=duration, default=600.0, help="soak length: 90s, 10m ... (default 10m)")
    parser.add_argument("--users", type=positive_int, default=10, help="concurrent users asking (default 10)")
    parser.add_argument("--fault-every", type=duration, default=60.0, help="one fault per this period (default 60s)")
    parser.add_argument("--stop-for", type=duration, default=10.0,
                        help="how long a SIGSTOPped service stays frozen before SIGCONT (default 10s)")
    parser.add_argument("--faults", type=fault_list, default=None, metavar="ACTION:SERVICE,...",
                        help="faults in order, cycled (kill or stop: kill:inference-0,stop:anns); default: "
                             "inference-0, anns, crawler, orchestrator, redis in turn, killed then stopped")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="attach to the stack up in this run directory; without one there, start one there "
                             "(default: a new temporary directory)")
    parser.add_argument("--keep-up", action="store_true", help="leave a stack this command started running")
    parser.add_argument("--replicas", type=positive_int, default=2, help="replicas of a stack started here (default 2)")
    parser.add_argument("--orchestrators", type=positive_int, default=2,
                        help="orchestrators of a stack started here, over one Redis (default 2: a fault hits the "
                             "first, `orchestrator`, and asks resume on the others)")
    parser.add_argument("--dtype", default="float32", help="dtype of a stack started here (default float32: "
                                                          "greedy answers compare exactly)")
    parser.add_argument("--corpus-root", type=Path, default=TUTORIAL,
                        help=f"corpus of a stack started here (default {TUTORIAL})")
    parser.add_argument("--index", type=Path, default=None,
                        help="its ANNS index (default <cache>/index/<corpus folder name>; built when missing)")
    parser.add_argument("--questions", type=positive_int, default=6,
                        help="questions from load_tests/questions.txt, each asked with anns, crawler and both, "
                             "streamed and not (default 6)")
    parser.add_argument("--max-tokens", type=positive_int, default=16, help="answer length cap (default 16)")
    parser.add_argument("--deadline", type=duration, default=300.0,
                        help="every ask's deadline, as the locust users' (default 300s)")
    parser.add_argument("--think", type=think_range, default=(1.0, 3.0), metavar="MIN,MAX",
                        help="think time between a user's asks, seconds (default 1,3)")
    parser.add_argument("--recover-timeout", type=duration, default=300.0,
                        help="how long a faulted service gets to be healthy again (default 300s)")
    parser.add_argument("--no-wait-for-ready", dest="wait_for_ready", action="store_false",
                        help="users' asks fail at once while no orchestrator can be reached (default: they wait "
                             "for one within their deadline, gRPC's wait_for_ready)")
    parser.add_argument("--seed", type=int, default=0, help="question order and think times")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")


@dataclass
class SoakOptions:
    duration_s: float = 600.0
    users: int = 10
    fault_every_s: float = 60.0
    stop_s: float = 10.0
    faults: list[tuple[str, str]] | None = None
    questions: int = 6
    max_tokens: int = 16
    deadline_s: float = 300.0
    think_s: tuple[float, float] = (1.0, 3.0)
    recover_timeout_s: float = 300.0
    seed: int = 0
    wait_for_ready: bool = True


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def wait_until(what: str, ready, timeout_s: float, every_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout_s:.0f} s")
        time.sleep(every_s)


def warm_up(clients, options: SoakOptions, timeout_s: float = 900.0) -> None:
    """Until one ask per retriever is answered with its documents (the ANNS index may still be building)."""
    from load_tests.chaos.workload import RETRIEVERS, AskSpec, load_questions, run_all

    question = load_questions(1)[0]
    pending = list(RETRIEVERS)

    def answered() -> bool:
        outcomes = run_all(clients, [AskSpec(question, r, True) for r in pending], len(pending),
                           options.deadline_s, options.max_tokens)
        for outcome in outcomes:
            if outcome.ok and outcome.sources:
                pending.remove(outcome.spec.retriever)
        return not pending

    wait_until(f"no answer with documents from {pending}", answered, timeout_s, every_s=5.0)


def soak(stack, options: SoakOptions, settings: dict | None = None) -> dict:
    """The whole run on a stack that is up: reference pass, soak, drain, checks; returns the report."""
    from load_tests.chaos.workload import Clients, ask_mix, load_questions

    settings = {**asdict(options), **(settings or {}), "dtype": stack.dtype,
                "orchestrators": len(stack.orchestrator.split(","))}
    specs = ask_mix(load_questions(options.questions), options.seed)
    clients = Clients(stack.orchestrator, stack.key, options.wait_for_ready, stack.tls)
    try:
        return _soak(stack, options, settings, specs, clients)
    finally:
        clients.close()


def _soak(stack, options: SoakOptions, settings: dict, specs, clients) -> dict:
    from load_tests.chaos.faults import FaultInjector, schedule
    from load_tests.chaos.observers import close_sessions, leaked_blocks, lost_events
    from load_tests.chaos.report import ask_row, compare_answers, summarize
    from load_tests.chaos.workload import IngestingSession, RecoveryProbe, Users, load_questions, run_all

    say("warming up: one answer per retriever")
    warm_up(clients, options)
    say(f"fault-free pass: {len(specs)} asks, {options.users} at a time")
    reference = run_all(clients, specs, options.users, options.deadline_s, options.max_tokens)
    say(f"fault-free pass: {sum(a.ok for a in reference)} of {len(reference)} answered")

    plans = schedule(options.duration_s, options.fault_every_s, options.faults)
    users = Users(clients, specs, options.users, options.deadline_s, options.max_tokens, options.think_s,
                  options.seed)
    session = IngestingSession(stack.orchestrator, stack.key, stack.tls)
    probe = RecoveryProbe(clients, load_questions(1)[0], options.deadline_s)
    injector = FaultInjector(stack, plans, options.stop_s, options.recover_timeout_s, say=say,
                             on_signal=probe.probe)
    say(f"soak: {options.users} users for {options.duration_s:.0f} s, {len(plans)} faults")
    t0, t0_unix = time.monotonic(), time.time()
    users.start()
    session.start()
    injector.start(t0)
    try:
        time.sleep(options.duration_s)
        injector.join()                 # faults delayed by a slow recovery still happen, under load
        last = max((r.healthy or 0.0 for r in injector.records), default=0.0)
        wait_until("no answer after the last fault", lambda: users.answered_since(last)
                   and all(r.probe_ok for r in injector.records if r.started), options.deadline_s, 1.0)
    except TimeoutError as exc:
        say(str(exc))
    finally:
        injector.abort()
        probe.finish()
        users.finish()                  # asks in flight end by their deadline
        session.finish()
    t_end = time.monotonic()
    say(f"soak over: {len(users.outcomes)} asks; waiting for every service to be up")
    names = [n for n in stack.services if n not in ("gateway",)]
    wait_until("services still down", lambda: all(stack.is_up(n) for n in names), options.recover_timeout_s)
    closed = close_sessions(stack.orchestrator, stack.key, tls=stack.tls)
    leaked = leaked_blocks(stack)
    continued: dict[str, list[dict]] = {}
    lost = lost_events(stack.orchestrator, stack.key, users.outcomes, continued=continued, tls=stack.tls)
    answers = compare_answers(reference, users.outcomes)
    addresses = {r.name: r.target for r in stack.replicas}
    report = summarize(users.outcomes, session.calls, injector.records, lost, leaked, answers, addresses, t0, t_end,
                       {**settings, "sessions_closed": len(closed), "soak_s": round(t_end - t0, 1)},
                       continuations(continued, t0, t0_unix), reference)
    report["reference"] = [ask_row(a, t0) for a in reference]
    report["probes"] = [ask_row(a, t0) for a in probe.outcomes]
    return report


def continuations(continued: dict[str, list[dict]], t0: float, t0_unix: float) -> list[dict]:
    """The store's CONTINUED events (orchestrator/ask.py: an answer continued after a break), each with its
    request id and `at` on the soak's monotonic clock."""
    rows = []
    for request_id, events in continued.items():
        for event in events:
            rows.append({**event, "request_id": request_id, "at": t0 + event["unix_ms"] / 1000 - t0_unix})
    return rows


def stack_in(run_dir: Path):
    from load_tests.chaos.stacks import LocalStack

    try:
        return LocalStack(run_dir)
    except FileNotFoundError:
        return None


def start_stack(args: argparse.Namespace, run_dir: Path) -> None:
    from servicekit.config import default_cache_dir

    index = args.index or default_cache_dir() / "index" / args.corpus_root.resolve().name
    command = [sys.executable, "-m", "streamrag.cli", "up", "--run-dir", str(run_dir), "--free-ports",
               "--replicas", str(args.replicas), "--orchestrators", str(args.orchestrators), "--dtype", args.dtype,
               "--corpus-root", str(args.corpus_root),
               "--index", str(index), "--timeout", "600"]
    say(f"starting a stack: {' '.join(command[2:])}")
    if subprocess.run(command, stdin=subprocess.DEVNULL).returncode != 0:
        raise SystemExit("error: `streamrag up` failed (its output is above)")


def stop_stack(run_dir: Path) -> None:
    subprocess.run([sys.executable, "-m", "streamrag.cli", "down", "--run-dir", str(run_dir)],
                   stdin=subprocess.DEVNULL)


def run_bench_chaos(args: argparse.Namespace) -> int:
    from load_tests.chaos.report import print_report

    if args.fault_every <= args.stop_for:
        raise SystemExit("error: --fault-every must be longer than --stop-for")
    run_dir = (args.run_dir or Path(tempfile.mkdtemp(prefix="streamrag-chaos-"))).resolve()
    stack = stack_in(run_dir)
    started_here = stack is None
    if started_here:
        start_stack(args, run_dir)
        stack = stack_in(run_dir)
    else:
        say(f"attached to the stack in {run_dir} (dtype {stack.dtype or '?'})")
    options = SoakOptions(args.duration, args.users, args.fault_every, args.stop_for, args.faults, args.questions,
                          args.max_tokens, args.deadline, args.think, args.recover_timeout, args.seed,
                          args.wait_for_ready)
    try:
        report = soak(stack, options, {"run_dir": str(run_dir), "started_stack": started_here,
                                       "replicas": len(stack.replicas)})
    finally:
        if started_here and not args.keep_up:
            stop_stack(run_dir)
    print_report(report, say)
    if args.json:
        write_json(args.json, report)
        say(f"wrote {args.json}")
    return 0
