"""`streamrag up | status | down`: the whole stack on this machine, as processes.

`up` builds the corpus index and prepares the embedded model when they are missing, then
starts each service of `plan_stack` as a `streamrag serve ...` child in its own session
(Redis first, the orchestrator last, each one once the services it needs are healthy),
waits until every service answers its health check, and records what it started in the
run directory (`--run-dir`, else `$STREAMRAG_RUN_DIR`, else `<cache>/run`):

    state.json            the stack: options, and per service its argv, address, pid, start time
    <service>.pid         the pid alone (`kill $(cat orchestrator.pid)` works)
    logs/<service>.log    the service's stdout and stderr (rewritten by each `up`)
    redis/                the private Redis's working directory (no persistence)

`down` stops only what `up` started (SIGTERM, SIGKILL after `--timeout`): never a Redis
given with `--redis`. `status` prints each service's health and key stats and exits 1 when
something is down. A pid is only ever signalled while its `/proc` start time still matches
the recorded one, so a reused pid is never touched.

`python -m orchestrator.stack probe grpc|http|redis TARGET` runs the same health check as
a command; the docker-compose health checks use it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servicekit.config import DEFAULT_PORTS, default_cache_dir, metrics_port_for

HOST = "127.0.0.1"
DEFAULT_CORPUS_ROOT = Path("/usr/share/doc/python3.11/html")
MAX_REPLICAS = 9                      # inference ports 50052..50060; the ANNS retriever has 50061
STATE_FILE = "state.json"
CLI = [sys.executable, "-m", "orchestrator.cli"]
# How each kind of service is checked: grpc.health.v1 Check, an HTTP 200, or a Redis PING.
CHECKS = {"redis": "redis", "corpus": "http", "retriever": "grpc", "inference": "grpc", "orchestrator": "grpc"}


@dataclass
class Service:
    """One process of the stack: what to run, where it answers, what it waits for."""

    name: str                          # "redis", "corpus", "anns", "crawler", "inference-0", ..., "orchestrator"
    kind: str                          # a key of CHECKS
    target: str                        # what its health check probes: redis URL, HTTP URL or host:port
    argv: list[str] | None             # None: not ours to start or stop (a Redis given with --redis)
    needs: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)   # every port it binds (gRPC and metrics)
    pid: int | None = None
    started: int | None = None         # /proc/<pid>/stat start time, in clock ticks

    @property
    def check(self) -> str:
        return CHECKS[self.kind]


class StackError(Exception):
    """`up` could not bring a service up; `service` names it (the message says why)."""

    def __init__(self, service: str, reason: str, log: Path | None = None) -> None:
        super().__init__(f"{service}: {reason}")
        self.service, self.reason, self.log = service, reason, log


# ---------------------------------------------------------------- the plan

def plan_stack(args: argparse.Namespace, index_dir: Path, redis_port: int) -> list[Service]:
    """The services `up` starts, in start order, on the default ports plus `--port-offset`."""
    offset = args.port_offset

    def port(service: str, replica: int = 0) -> int:
        return DEFAULT_PORTS[service] + offset + replica

    def metrics(service: str, replica: int = 0) -> int:
        return metrics_port_for(service, replica) + offset

    def grpc_flags(service: str, replica: int = 0) -> list[str]:
        return ["--host", HOST, "--port", str(port(service, replica)),
                "--metrics-port", str(metrics(service, replica))]

    serve = [*CLI, "serve"]
    corpus_url = f"http://{HOST}:{port('corpus')}/index.html"
    if args.redis:
        redis = Service("redis", "redis", args.redis, None)
    else:
        redis = Service("redis", "redis", f"redis://{HOST}:{redis_port}/0", [
            shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--bind", HOST,
            "--save", "", "--appendonly", "no", "--dir", "redis", "--daemonize", "no"], ports=[redis_port])
    corpus = Service("corpus", "corpus", corpus_url, [
        *serve, "corpus", "--root", str(args.corpus_root), "--host", HOST, "--port", str(port("corpus")),
        "--latency", args.latency], ports=[port("corpus")])
    anns = Service("anns", "retriever", f"{HOST}:{port('anns')}", [
        *serve, "retriever", "--kind", "anns", "--index", str(index_dir), *grpc_flags("anns")],
        ports=[port("anns"), metrics("anns")])
    model = ["--model", str(args.model)] if args.model else []
    inference = [Service(f"inference-{i}", "inference", f"{HOST}:{port('inference', i)}", [
        *serve, "inference", *grpc_flags("inference", i), "--policy", args.policy, "--dtype", args.dtype,
        "--device", args.device, "--backend", getattr(args, "backend", "native"), *model],
        ports=[port("inference", i), metrics("inference", i)])
        for i in range(args.replicas)]
    crawler = Service("crawler", "retriever", f"{HOST}:{port('crawler')}", [
        *serve, "retriever", "--kind", "crawler", "--start-url", corpus_url, *grpc_flags("crawler")],
        needs=["corpus"], ports=[port("crawler"), metrics("crawler")])
    services = [redis, corpus, anns, *inference, crawler]    # the slow loaders (ANNS, inference) start first
    orchestrator = Service("orchestrator", "orchestrator", f"{HOST}:{port('orchestrator')}", [
        *serve, "orchestrator", *grpc_flags("orchestrator"), "--redis", redis.target,
        *[flag for s in inference for flag in ("--inference", s.target)],
        "--anns", anns.target, "--crawler", crawler.target],
        needs=[s.name for s in services], ports=[port("orchestrator"), metrics("orchestrator")])
    return [*services, orchestrator]


# ---------------------------------------------------------------- health checks

def check_health(check: str, target: str, timeout_s: float = 2.0) -> str | None:
    """None when the service is healthy, else a short reason ("connection refused", "NOT_SERVING")."""
    try:
        if check == "grpc":
            import grpc
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            with grpc.insecure_channel(target) as channel:
                try:
                    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                                       timeout=timeout_s).status
                except grpc.RpcError as exc:
                    return f"{exc.code().name.lower()}: {exc.details()}"
            serving = health_pb2.HealthCheckResponse.SERVING
            return None if status == serving else health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        if check == "http":
            import urllib.error
            import urllib.request

            try:
                with urllib.request.urlopen(target, timeout=timeout_s) as response:
                    return None if response.status == 200 else f"HTTP {response.status}"
            except urllib.error.HTTPError as exc:
                return f"HTTP {exc.code}"
        if check == "redis":
            import redis

            client = redis.Redis.from_url(target, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
            try:
                return None if client.ping() else "no PONG"
            finally:
                client.close()
    except Exception as exc:       # refused, timed out, unreachable: the reason is all we need
        return str(getattr(exc, "reason", None) or exc) or type(exc).__name__
    raise ValueError(f"unknown health check {check!r}")


def probe_timeout(service: Service, options: dict, base_s: float) -> float:
    """The corpus server delays every request, health checks too: allow for its longest delay."""
    if service.kind != "corpus":
        return base_s
    from retriever_svc.corpus_server import latency_profile

    return base_s + latency_profile(options["latency"]).cap_s


def service_details(service: Service, options: dict, timeout_s: float = 2.0) -> str:
    """Key stats for `status`: KV blocks and queue for inference, kind and corpus for retrievers."""
    if service.kind == "redis":
        return "private" if service.argv else "external (not stopped by down)"
    if service.kind == "corpus":
        return f"latency {options['latency']}; {options['corpus_root']}"
    if service.kind == "orchestrator":
        return f"{options['replicas']} inference replica(s)"
    import grpc

    from protos import inference_pb2, inference_pb2_grpc, retriever_pb2, retriever_pb2_grpc

    with grpc.insecure_channel(service.target) as channel:
        try:
            if service.kind == "inference":
                stats = inference_pb2_grpc.InferenceStub(channel).GetStats(inference_pb2.GetStatsRequest(),
                                                                           timeout=timeout_s).stats
                pools = ", ".join(f"{p.name} {p.free_blocks}/{p.total_blocks}" for p in stats.pools)
                return (f"policy {stats.policy}; KV free/total blocks: {pools}; "
                        f"running {stats.num_running}, waiting {stats.num_waiting}")
            info = retriever_pb2_grpc.RetrieverStub(channel).Describe(retriever_pb2.RetrieverDescribeRequest(),
                                                                      timeout=timeout_s).retriever_info
        except grpc.RpcError as exc:
            return f"({exc.code().name.lower()})"
    kind = retriever_pb2.RetrieverKind.Name(info.kind).removeprefix("RETRIEVER_KIND_").lower()
    if info.num_documents:
        return f"{kind}; corpus {info.corpus}, {info.num_documents} documents"
    return f"{kind}; starts at {info.facts.get('start_urls', '?')}"


# ---------------------------------------------------------------- processes

def process_start_ticks(pid: int) -> int | None:
    """The process's start time from /proc (None: no such process, or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()      # after "pid (comm)": state is field 3, starttime field 22
    return None if fields[0] in ("Z", "X") else int(fields[19])


def is_running(service: Service) -> bool:
    """True while the process `up` started is still alive (a reused pid does not count)."""
    if service.pid is None or service.started is None:
        return False
    return process_start_ticks(service.pid) == service.started


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    env.setdefault("RUST_LOG", "warn")        # DiskANN logs every search otherwise
    return env


def start_service(service: Service, run_dir: Path) -> subprocess.Popen:
    """Start one service in its own session (Ctrl-C on `up` does not reach it), output to its log."""
    log = log_path(run_dir, service.name)
    with open(log, "wb") as out:
        proc = subprocess.Popen(service.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=run_dir, env=child_env(), start_new_session=True)
    service.pid, service.started = proc.pid, process_start_ticks(proc.pid)
    (run_dir / f"{service.name}.pid").write_text(f"{proc.pid}\n")
    return proc


def stop_services(services: list[Service], timeout_s: float) -> list[str]:
    """SIGTERM every running one, wait up to `timeout_s`, SIGKILL the rest; returns the names killed."""
    def signal_all(group: list[Service], sig: signal.Signals) -> None:
        for s in group:
            if is_running(s):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(s.pid, sig)

    def wait_gone(group: list[Service], seconds: float) -> list[Service]:
        deadline = time.monotonic() + seconds
        while (left := [s for s in group if is_running(s)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    signal_all(services, signal.SIGTERM)
    stubborn = wait_gone(services, timeout_s)
    signal_all(stubborn, signal.SIGKILL)
    wait_gone(stubborn, 5.0)
    return [s.name for s in stubborn]


def stop_in_order(services: list[Service], timeout_s: float) -> list[str]:
    """The orchestrator first (no new work), then the workers, then Redis (the store's last flush)."""
    ours = [s for s in services if s.argv]
    waves = [[s for s in ours if s.kind == "orchestrator"],
             [s for s in ours if s.kind not in ("orchestrator", "redis")],
             [s for s in ours if s.kind == "redis"]]
    return [name for wave in waves for name in stop_services(wave, timeout_s)]


# ---------------------------------------------------------------- run directory

def default_run_dir() -> Path:
    env = os.environ.get("STREAMRAG_RUN_DIR")
    return Path(env).expanduser() if env else default_cache_dir() / "run"


def log_path(run_dir: Path, name: str) -> Path:
    return run_dir / "logs" / f"{name}.log"


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """One `up`/`down` at a time per run directory."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_state(run_dir: Path, options: dict, services: list[Service]) -> None:
    state = {"version": 1, "options": options, "services": [asdict(s) for s in services]}
    partial = run_dir / f".{STATE_FILE}.partial"
    partial.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(partial, run_dir / STATE_FILE)


def read_stack(run_dir: Path | None = None) -> tuple[dict, list[Service]] | None:
    """The stack recorded in `run_dir` (options, services), or None when there is none.

    Other commands can use it to find the running stack (its orchestrator and Redis addresses).
    """
    path = (run_dir or default_run_dir()) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state["options"], [Service(**s) for s in state["services"]]


def clear_state(run_dir: Path, services: list[Service]) -> None:
    for s in services:
        (run_dir / f"{s.name}.pid").unlink(missing_ok=True)
    (run_dir / STATE_FILE).unlink(missing_ok=True)


# ---------------------------------------------------------------- up

def add_up_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag up`."""
    from inference_svc.server_args import BACKEND_CHOICES, DTYPE_CHOICES, POLICY_CHOICES

    parser.add_argument("--replicas", type=int, default=1, help=f"inference replicas, 1 to {MAX_REPLICAS} (default 1)")
    parser.add_argument("--policy", default="fcfs", choices=POLICY_CHOICES, help="scheduling policy (default fcfs)")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPE_CHOICES, help="inference dtype (default bfloat16)")
    parser.add_argument("--device", default="cpu", help="inference device: cpu or cuda[:N] (default cpu)")
    parser.add_argument("--backend", default="native", choices=BACKEND_CHOICES,
                        help="inference engine: native (default) or vllm (run `up` from a Python with the vllm "
                             "extra, see docs/vllm.md)")
    parser.add_argument("--model", type=Path, default=None,
                        help="Hugging Face model directory (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--redis", default=None, metavar="URL",
                        help="use this Redis instead of starting a private one (down leaves it running)")
    parser.add_argument("--latency", default="none",
                        help="corpus server delay per page: none, lan, web or seconds (default none: a fast demo; "
                             "web gives the paper's crawler gaps)")
    parser.add_argument("--corpus-root", type=Path, default=DEFAULT_CORPUS_ROOT,
                        help=f"HTML site the corpus server serves and the index is built from "
                             f"(default {DEFAULT_CORPUS_ROOT})")
    parser.add_argument("--index", type=Path, default=None,
                        help="ANNS index directory, built from --corpus-root if missing "
                             "(default: <cache>/index/python-3.11-docs for the default corpus)")
    parser.add_argument("--port-offset", type=int, default=0,
                        help="add this to every default port (gRPC, metrics, corpus, Redis) to run beside another "
                             "stack; `streamrag ask --orchestrator 127.0.0.1:<50051+offset>` then")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds every service gets to become healthy (default 300)")
    add_run_dir_arg(parser)


def add_run_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="pid files, logs and state (default $STREAMRAG_RUN_DIR or <cache>/run)")


def default_index_for(corpus_root: Path) -> Path:
    from retriever_svc.corpus.index import default_index_dir

    if corpus_root.resolve() == DEFAULT_CORPUS_ROOT.resolve():
        return default_index_dir()
    return default_cache_dir() / "index" / corpus_root.resolve().name


def run_foreground(step: str, argv: list[str]) -> None:
    """A preparation command with its progress on this terminal."""
    code = subprocess.run(argv, env=child_env(), stdin=subprocess.DEVNULL).returncode
    if code != 0:
        raise StackError(step, f"`streamrag {' '.join(argv[len(CLI):])}` failed (exit code {code})")


def prepare(args: argparse.Namespace, index_dir: Path) -> None:
    """Build the index and prepare the embedded model when missing (not counted in --timeout)."""
    from retriever_svc.corpus.index import read_manifest

    if read_manifest(index_dir) is None:
        print(f"index {index_dir} is missing or incomplete: building it from {args.corpus_root}", flush=True)
        run_foreground("index", [*CLI, "index", "build", "--source", str(args.corpus_root), "--out", str(index_dir)])
    if args.model is None:
        from inference_svc.embedded_model import embedded_model_dir

        if not (embedded_model_dir() / "config.json").exists():
            print("the embedded model is not prepared yet: converting it once", flush=True)
            run_foreground("model", [*CLI, "model", "prepare"])


def choose_redis_port(args: argparse.Namespace) -> int:
    """Our own Redis on 6379 (+offset), or on a free port when another server already has that one."""
    port = DEFAULT_PORTS["redis"] + args.port_offset
    if args.redis or not port_in_use(port):
        return port
    chosen = free_port()
    print(f"port {port} is taken (another Redis?): the stack's private Redis uses port {chosen}", flush=True)
    return chosen


def check_ports(services: list[Service]) -> None:
    for s in services:
        for port in s.ports:
            if not 0 < port < 65536:
                raise StackError(s.name, f"port {port} is out of range: lower --port-offset")
            if port_in_use(port):
                raise StackError(s.name, f"port {port} is already in use: stop what holds it, "
                                         f"or run beside it with --port-offset N")


class Launch:
    """One `up`: starts services, waits for their health, stops them all if one fails."""

    def __init__(self, run_dir: Path, options: dict, services: list[Service], timeout_s: float) -> None:
        self.run_dir, self.options, self.services = run_dir, options, services
        self.by_name = {s.name: s for s in services}
        self.procs: dict[str, subprocess.Popen] = {}
        self.healthy: set[str] = set()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout_s
        self.timeout_s = timeout_s

    def start(self, service: Service) -> None:
        for need in service.needs:
            self.wait_healthy(self.by_name[need])
        if service.argv:
            print(f"  starting {service.name:<13} {service.target}", flush=True)
            self.procs[service.name] = start_service(service, self.run_dir)
            write_state(self.run_dir, self.options, self.services)

    def wait_healthy(self, service: Service) -> None:
        timeout_s = probe_timeout(service, self.options, 2.0)
        while service.name not in self.healthy:
            proc = self.procs.get(service.name)
            if proc is not None and proc.poll() is not None:
                raise StackError(service.name, f"exited with code {proc.returncode} before it was healthy",
                                 log_path(self.run_dir, service.name))
            reason = check_health(service.check, service.target, timeout_s)
            if reason is None:
                self.healthy.add(service.name)
                print(f"  {service.name:<22} healthy after {time.monotonic() - self.t0:.1f} s", flush=True)
            elif time.monotonic() > self.deadline:
                raise StackError(service.name, f"not healthy after {self.timeout_s:.0f} s (last check: {reason})",
                                 log_path(self.run_dir, service.name) if service.argv else None)
            else:
                time.sleep(0.25)

    def abort(self) -> None:
        print("stopping the services already started", file=sys.stderr, flush=True)
        stop_in_order(self.services, timeout_s=10.0)
        for proc in self.procs.values():       # reap our children
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        clear_state(self.run_dir, self.services)


def already_up(run_dir: Path) -> int | None:
    """Exit status when a stack is recorded in `run_dir` (0: it is up; 1: partly down); None: start one."""
    recorded = read_stack(run_dir)
    if recorded is None:
        return None
    options, services = recorded
    ours = [s for s in services if s.argv]
    dead = [s.name for s in ours if not is_running(s)]
    if len(dead) == len(ours):                 # a stack that is gone (crash, reboot): forget it
        clear_state(run_dir, services)
        return None
    orchestrator = next(s.target for s in services if s.kind == "orchestrator")
    if dead:
        print(f"error: the stack in {run_dir} is partly down ({', '.join(dead)} not running): "
              f"run `streamrag down`, then `streamrag up`", file=sys.stderr)
        return 1
    print(f"the stack is already up ({options['replicas']} inference replica(s), policy {options['policy']}, "
          f"orchestrator {orchestrator}, run dir {run_dir}); `streamrag status` shows its health, "
          f"`streamrag down` stops it")
    return 0


def run_up(args: argparse.Namespace) -> int:
    """`streamrag up`: start the stack, or say it is already up."""
    if not 1 <= args.replicas <= MAX_REPLICAS:
        print(f"error: --replicas must be between 1 and {MAX_REPLICAS}, got {args.replicas}", file=sys.stderr)
        return 2
    if args.port_offset < 0:
        print(f"error: --port-offset must be 0 or more, got {args.port_offset}", file=sys.stderr)
        return 2
    from retriever_svc.corpus_server import latency_profile

    try:
        latency_profile(args.latency)
    except ValueError as exc:
        print(f"error: --latency: {exc}", file=sys.stderr)
        return 2
    if args.redis is None and shutil.which("redis-server") is None:
        print("error: redis-server is not installed: install it (apt-get install redis-server) "
              "or pass --redis URL", file=sys.stderr)
        return 2
    run_dir = (args.run_dir or default_run_dir()).expanduser().resolve()
    args.corpus_root = args.corpus_root.expanduser().resolve()
    index_dir = (args.index or default_index_for(args.corpus_root)).expanduser().resolve()
    with locked(run_dir):
        status = already_up(run_dir)
        if status is not None:
            return status
        launch = None
        try:
            prepare(args, index_dir)
            services = plan_stack(args, index_dir, choose_redis_port(args))
            check_ports(services)
            (run_dir / "logs").mkdir(exist_ok=True)
            (run_dir / "redis").mkdir(exist_ok=True)
            options = {"replicas": args.replicas, "policy": args.policy, "dtype": args.dtype, "device": args.device,
                       "backend": args.backend,
                       "latency": args.latency, "port_offset": args.port_offset, "index": str(index_dir),
                       "corpus_root": str(args.corpus_root), "started_unix": int(time.time())}
            print(f"starting the stack (run dir {run_dir})", flush=True)
            launch = Launch(run_dir, options, services, args.timeout)
            for service in services:
                launch.start(service)
            for service in services:
                launch.wait_healthy(service)
        except StackError as exc:
            print(f"error: {exc.service} failed: {exc.reason}", file=sys.stderr)
            if exc.log is not None:
                print(f"--- last lines of {exc.log} ---\n{log_tail(exc.log)}\n---", file=sys.stderr)
            if launch is not None:
                launch.abort()
            return 1
        except KeyboardInterrupt:
            if launch is not None:
                launch.abort()
            return 130
    orchestrator = services[-1].target
    ask = "streamrag ask" + ("" if args.port_offset == 0 else f" --orchestrator {orchestrator}")
    print(f"the stack is up in {time.monotonic() - launch.t0:.1f} s: orchestrator {orchestrator}, "
          f"Redis {services[0].target}\n  try: {ask} \"How do I read a file line by line?\"\n"
          f"  `streamrag status` shows its health, `streamrag down` stops it")
    return 0


# ---------------------------------------------------------------- status and down

def add_status_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag status`."""
    add_run_dir_arg(parser)
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds each health check may take")


def run_status(args: argparse.Namespace) -> int:
    """`streamrag status`: a table of health and stats; exit 1 when something is down."""
    run_dir = (args.run_dir or default_run_dir()).expanduser().resolve()
    recorded = read_stack(run_dir)
    if recorded is None:
        print(f"no stack is up (run dir {run_dir}): start one with `streamrag up`")
        return 1
    options, services = recorded
    rows = [("SERVICE", "PID", "ADDRESS", "HEALTH", "DETAILS")]
    down = []
    for s in services:
        if s.argv and not is_running(s):
            health, details = "DOWN", f"process {s.pid} is gone; see {log_path(run_dir, s.name)}"
        elif (reason := check_health(s.check, s.target, probe_timeout(s, options, args.timeout))) is not None:
            health, details = "DOWN", reason
        else:
            health, details = "healthy", service_details(s, options, args.timeout)
        if health != "healthy":
            down.append(s.name)
        rows.append((s.name, str(s.pid or "-"), s.target, health, details))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
    print(f"{len(services) - len(down)} of {len(services)} healthy" + (f"; down: {', '.join(down)}" if down else ""))
    return 1 if down else 0


def add_down_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag down`."""
    add_run_dir_arg(parser)
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds each service gets to stop after SIGTERM before SIGKILL (default 20)")


def run_down(args: argparse.Namespace) -> int:
    """`streamrag down`: stop what `up` started, remove the pid files and the state."""
    run_dir = (args.run_dir or default_run_dir()).expanduser().resolve()
    with locked(run_dir):
        recorded = read_stack(run_dir)
        if recorded is None:
            print(f"no stack is up (run dir {run_dir})")
            return 0
        _, services = recorded
        running = [s.name for s in services if s.argv and is_running(s)]
        killed = stop_in_order(services, args.timeout)
        clear_state(run_dir, services)
    external = [s.target for s in services if not s.argv]
    print(f"stopped {len(running)} service(s): {', '.join(running) or 'none were running'}"
          + (f"; killed after {args.timeout:.0f} s: {', '.join(killed)}" if killed else "")
          + (f"; left the external Redis {external[0]} running" if external else ""))
    return 0


# ---------------------------------------------------------------- probe command (compose health checks)

def probe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.stack",
                                     description="health check one service: exit 0 when healthy")
    commands = parser.add_subparsers(dest="command", required=True)
    probe = commands.add_parser("probe", help="grpc.health.v1 Check, HTTP 200 or Redis PING")
    probe.add_argument("check", choices=sorted(set(CHECKS.values())))
    probe.add_argument("target", help="host:port (grpc), URL (http) or redis:// URL")
    probe.add_argument("--timeout", type=float, default=3.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = probe_parser().parse_args(argv)
    reason = check_health(args.check, args.target, args.timeout)
    if reason is not None:
        print(f"{args.target}: {reason}", file=sys.stderr)
    return 0 if reason is None else 1


if __name__ == "__main__":
    sys.exit(main())
