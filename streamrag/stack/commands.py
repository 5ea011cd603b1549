"""`streamrag up | status | down`: the whole stack on this machine, as processes.

`up` builds the corpus index and prepares the embedded model when they are missing, then
starts each service of `plan_stack` as a `streamrag serve ...` child in its own session
(Redis first, the orchestrator last, each one once the services it needs are healthy),
waits until every service answers its health check, records what it started in the run
directory (`streamrag.stack.state`) and starts the supervisor, which starts again a service
that dies (`streamrag.stack.supervisor`). `up(StackOptions(...))` does the same from Python.
`up` on a stack that is partly down starts only what is down (and the supervisor, if it is
gone too).

`down` stops the supervisor, then only what `up` started (SIGTERM, SIGKILL after
`--timeout`): never a Redis given with `--redis`. `status` prints each service's health,
restarts and key stats, and exits 1 when something is down. `restart(run_dir, names)` stops
and starts services on purpose (the demo starts each run on a fresh replica); it does not
count as a crash.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from inference_svc.engine.options import DTYPE_CHOICES, POLICY_CHOICES
from inference_svc.options import BACKEND_CHOICES
from servicekit.config import DEFAULT_PORTS
from servicekit.health import check_health
from servicekit.redis_url import RedisUrlError, check_reachable
from servicekit.tenants import load_tenants
from streamrag.stack.plan import (
    CLI,
    DEFAULT_CORPUS_ROOT,
    HOST,
    MAX_ORCHESTRATORS,
    MAX_REPLICAS,
    Service,
    StackError,
    StackOptions,
    default_index_for,
    plan_stack,
    probe_timeout,
    replica_roles,
)
from streamrag.stack.processes import (
    Launch,
    child_env,
    free_port,
    is_running,
    port_in_use,
    stop_in_order,
    stop_services,
)
from streamrag.stack.state import (
    StackState,
    clear_state,
    locked,
    log_path,
    log_tail,
    read_state,
    resolve_run_dir,
)
from streamrag.stack.tls import TLS_KINDS, cert_name, prepare_certs, stack_client_tls


def add_up_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag up`: one per `StackOptions` field, with its default."""
    d = StackOptions()
    parser.add_argument("--replicas", type=int, default=d.replicas,
                        help=f"inference replicas, 1 to {MAX_REPLICAS} (default {d.replicas})")
    parser.add_argument("--orchestrators", type=int, default=d.orchestrators,
                        help=f"orchestrators over the same Redis, 1 to {MAX_ORCHESTRATORS} (default "
                             f"{d.orchestrators}): the gateway and `streamrag ask` spread asks over them, and an ask "
                             "whose orchestrator dies resumes on another")
    parser.add_argument("--prefill-replicas", type=int, default=d.prefill_replicas,
                        help="disaggregated serving: this many prefill replicas (with --decode-replicas; "
                             "replaces --replicas; docs/disagg.md)")
    parser.add_argument("--decode-replicas", type=int, default=d.decode_replicas,
                        help="disaggregated serving: this many decode replicas (with --prefill-replicas)")
    parser.add_argument("--policy", default=d.policy, choices=POLICY_CHOICES,
                        help=f"scheduling policy (default {d.policy})")
    parser.add_argument("--dtype", default=d.dtype, choices=DTYPE_CHOICES, help=f"inference dtype (default {d.dtype})")
    parser.add_argument("--device", default=d.device, help=f"inference device: cpu or cuda[:N] (default {d.device})")
    parser.add_argument("--backend", default=d.backend, choices=BACKEND_CHOICES,
                        help="inference engine: native (default) or vllm (run `up` from a Python with the vllm "
                             "extra, see docs/vllm.md)")
    parser.add_argument("--model", type=Path, default=d.model,
                        help="Hugging Face model directory (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--redis", default=d.redis, metavar="URL",
                        help="use this Redis instead of starting a private one (down leaves it running): "
                             "redis://HOST:PORT/DB, or a Sentinel set's primary, "
                             "redis+sentinel://HOST:PORT[,HOST:PORT]/MASTER/DB")
    parser.add_argument("--latency", default=d.latency,
                        help="corpus server delay per page: none, lan, web or seconds (default none: a fast demo; "
                             "web gives the paper's crawler gaps)")
    parser.add_argument("--corpus-root", type=Path, default=d.corpus_root,
                        help=f"HTML site the corpus server serves and the index is built from "
                             f"(default {DEFAULT_CORPUS_ROOT})")
    parser.add_argument("--index", type=Path, default=d.index,
                        help="ANNS index directory, built from --corpus-root if missing "
                             "(default: <cache>/index/python-3.11-docs for the default corpus)")
    parser.add_argument("--anns-backend", choices=["diskannpy", "milvus"], default=d.anns_backend,
                        help="where the ANNS retriever searches: diskannpy (in its process) or milvus (an embedded "
                             "Milvus server the stack starts; needs the milvus extra, docs/documents.md)")
    parser.add_argument("--port-offset", type=int, default=d.port_offset,
                        help="add this to every default port (gRPC, metrics, corpus, Redis) to run beside another "
                             "stack; `streamrag ask --orchestrator 127.0.0.1:<50051+offset>` then")
    parser.add_argument("--free-ports", action="store_true",
                        help="every service on a port the kernel picks (instead of the defaults plus "
                             "--port-offset); `streamrag status` shows them, `streamrag ask` finds the orchestrator")
    parser.add_argument("--timeout", type=float, default=d.timeout,
                        help=f"seconds every service gets to become healthy (default {d.timeout:.0f})")
    parser.add_argument("--tls-dir", type=Path, default=d.tls_dir, metavar="DIR",
                        help="mutual TLS between the services and HTTPS on the gateway, with the certificates of "
                             "`streamrag certs` in DIR (made there when DIR has no ca.crt); clients verify "
                             "with DIR/ca.crt and present DIR/client.crt")
    parser.add_argument("--tenants", type=Path, default=d.tenants, metavar="FILE",
                        help="tenants file (TOML: keys, weight and limits per tenant; docs/gateway.md) for the "
                             "gateway and the orchestrators")
    add_run_dir_arg(parser)


def add_run_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="pid files, logs and state (default $STREAMRAG_RUN_DIR or <cache>/run)")


def run_foreground(step: str, argv: list[str]) -> None:
    """A preparation command with its progress on this terminal."""
    code = subprocess.run(argv, env=child_env(), stdin=subprocess.DEVNULL).returncode
    if code != 0:
        raise StackError(step, f"`streamrag {' '.join(argv[len(CLI):])}` failed (exit code {code})")


def prepare(options: StackOptions, index_dir: Path) -> None:
    """Prepare the embedded model when missing (not counted in --timeout). A missing index is built by the
    ANNS retriever in the background (`--build-from`), so the stack answers through the crawler meanwhile."""
    from retriever_svc.corpus.index import read_manifest

    if read_manifest(index_dir) is None:
        print(f"index {index_dir} is missing: the ANNS retriever builds it from {options.corpus_root} in the "
              "background (`streamrag collection list` shows its progress; the crawler answers meanwhile)",
              flush=True)
    if options.model is None:
        from inference_svc.embedded_model import embedded_model_dir

        if not (embedded_model_dir() / "config.json").exists():
            print("the embedded model is not prepared yet: converting it once", flush=True)
            run_foreground("model", [*CLI, "model", "prepare"])


def ensure_api_key(run_dir: Path) -> Path | None:
    """The stack's API key file: made once (a random key, readable by its owner only) unless STREAMRAG_API_KEY
    is set, in which case the services read that key from the environment and no file is needed."""
    import secrets

    from servicekit.auth import API_KEY_ENV

    if os.environ.get(API_KEY_ENV, "").strip():
        return None
    path = run_dir / "api-key"
    if not path.is_file():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
    return path


def api_key_line(options: dict) -> str:
    """Where the stack's key is, for `up` and `status`."""
    from servicekit.auth import API_KEY_ENV

    if options.get("api_key_file"):
        return (f"API key: in {options['api_key_file']} (the CLI uses it; other clients send "
                f"`Authorization: Bearer $(cat {options['api_key_file']})`)")
    return f"API key: ${API_KEY_ENV}"


def tls_line(options: dict) -> str:
    """How the stack is secured, for `up` and `status` (a stack with --tls-dir)."""
    tls_dir = options["tls_dir"]
    return (f"TLS: mutual TLS between the services, HTTPS on the gateway; clients verify with {tls_dir}/ca.crt "
            f"and present {tls_dir}/client.crt and client.key")


def choose_redis_port(options: StackOptions) -> int:
    """Our own Redis on 6379 (+offset), or on a free port when another server already has that one."""
    port = DEFAULT_PORTS["redis"] + options.port_offset
    if options.free_ports and not options.redis:
        return free_port()
    if options.redis or not port_in_use(port):
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


def report_failure(exc: StackError) -> None:
    print(f"error: {exc.service} failed: {exc.reason}", file=sys.stderr)
    if exc.log is not None:
        print(f"--- last lines of {exc.log} ---\n{log_tail(exc.log)}\n---", file=sys.stderr)


def stop_supervisor(state: StackState, timeout_s: float = 10.0) -> None:
    if state.supervisor is not None:
        stop_services([state.supervisor], timeout_s)


def already_up(run_dir: Path, timeout_s: float = 300.0) -> int | None:
    """When a stack is recorded in `run_dir`: start what is down of it (and the supervisor) and
    return the exit status of `up`; None when there is none to resume (then start one)."""
    state = read_state(run_dir)
    if state is None:
        return None
    ours = [s for s in state.services if s.argv]
    dead = [s for s in ours if not is_running(s)]
    if len(dead) == len(ours):                 # a stack that is gone (crash, reboot): forget it
        stop_supervisor(state)
        clear_state(run_dir, state.services)
        return None
    orchestrator = next(s.target for s in state.services if s.kind == "orchestrator")
    supervised = state.supervisor is not None and is_running(state.supervisor)
    if not dead and supervised:
        print(f"the stack is already up ({state.options['replicas']} inference replica(s), policy "
              f"{state.options['policy']}, orchestrator {orchestrator}, run dir {run_dir}); `streamrag status` "
              f"shows its health, `streamrag down` stops it")
        return 0
    if dead:
        print(f"the stack in {run_dir} is partly down ({', '.join(s.name for s in dead)} not running): "
              f"starting only that", flush=True)
    launch = Launch(run_dir, state, timeout_s)
    try:
        for service in dead:
            launch.start(service, note="started again by `streamrag up`")
        for service in state.services:
            launch.wait_healthy(service)
    except StackError as exc:
        report_failure(exc)
        return 1
    finally:
        launch.start_supervisor()              # whatever happened: from now on what dies is started again
    print(f"the stack is up again ({', '.join(s.name for s in dead) or 'the supervisor'} started): "
          f"orchestrator {orchestrator}")
    return 0


def check_options(options: StackOptions) -> str | None:
    """What is wrong with the options (a message for the user), or None."""
    from retriever_svc.corpus.web_server import latency_profile

    if not 1 <= options.replicas <= MAX_REPLICAS:
        return f"--replicas must be between 1 and {MAX_REPLICAS}, got {options.replicas}"
    if not 1 <= options.orchestrators <= MAX_ORCHESTRATORS:
        return f"--orchestrators must be between 1 and {MAX_ORCHESTRATORS}, got {options.orchestrators}"
    if options.prefill_replicas or options.decode_replicas:
        split = options.prefill_replicas, options.decode_replicas
        if min(split) < 1 or sum(split) > MAX_REPLICAS:
            return (f"--prefill-replicas and --decode-replicas must both be 1 or more, {MAX_REPLICAS} in all; "
                    f"got {split[0]} and {split[1]}")
    if options.port_offset < 0:
        return f"--port-offset must be 0 or more, got {options.port_offset}"
    try:
        latency_profile(options.latency)
    except ValueError as exc:
        return f"--latency: {exc}"
    if options.redis is None and shutil.which("redis-server") is None:
        return "redis-server is not installed: install it (apt-get install redis-server) or pass --redis URL"
    if options.redis is not None:
        try:                           # a Sentinel set must answer now: the orchestrators would not start
            check_reachable(options.redis)
        except RedisUrlError as exc:
            return f"--redis: {exc}"
    return None


def up(options: StackOptions) -> int:
    """Start the stack, or say it is already up; returns the exit status of `streamrag up`."""
    if (problem := check_options(options)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    run_dir = resolve_run_dir(options.run_dir)
    corpus_root = Path(options.corpus_root).expanduser().resolve()
    options = replace(options, corpus_root=corpus_root)
    index_dir = (options.index or default_index_for(corpus_root)).expanduser().resolve()
    if options.tls_dir is not None:            # the services run in the run directory: an absolute path
        options = replace(options, tls_dir=Path(options.tls_dir).expanduser().resolve())
    if options.tenants is not None:
        options = replace(options, tenants=Path(options.tenants).expanduser().resolve())
        load_tenants(options.tenants)          # a bad file stops `up` at once, with its line
    with locked(run_dir):
        status = already_up(run_dir, options.timeout)
        if status is not None:
            return status
        launch = None
        try:
            prepare(options, index_dir)
            api_key_file = ensure_api_key(run_dir)
            services = plan_stack(options, index_dir, choose_redis_port(options), free_port, api_key_file)
            check_ports(services)
            if options.tls_dir is not None and (problem := prepare_certs(
                    options.tls_dir, [cert_name(s.name, s.kind) for s in services if s.kind in TLS_KINDS])):
                raise StackError("tls", problem)
            (run_dir / "logs").mkdir(exist_ok=True)
            (run_dir / "redis").mkdir(exist_ok=True)
            recorded = {"replicas": len(replica_roles(options)), "roles": replica_roles(options),
                        "policy": options.policy, "dtype": options.dtype,
                        "device": options.device, "backend": options.backend, "latency": options.latency,
                        "port_offset": options.port_offset, "free_ports": options.free_ports,
                        "index": str(index_dir), "corpus_root": str(corpus_root), "started_unix": int(time.time()),
                        "api_key_file": str(api_key_file) if api_key_file else None,
                        "tls_dir": str(options.tls_dir) if options.tls_dir else None}
            print(f"starting the stack (run dir {run_dir})", flush=True)
            launch = Launch(run_dir, StackState(recorded, services), options.timeout)
            for service in services:
                launch.start(service)
            for service in services:
                launch.wait_healthy(service)
            launch.start_supervisor()
        except StackError as exc:
            report_failure(exc)
            if launch is not None:
                launch.abort()
            return 1
        except KeyboardInterrupt:
            if launch is not None:
                launch.abort()
            return 130
    by_name = {s.name: s for s in services}
    orchestrator = by_name["orchestrator"].target
    orchestrators = ", ".join(s.target for s in services if s.kind == "orchestrator")
    gateway = by_name["gateway"].target.removesuffix("/health")
    ask = "streamrag ask" + ("" if orchestrator == f"{HOST}:{DEFAULT_PORTS['orchestrator']}"
                             else f" --orchestrator {orchestrator}")
    print(f"the stack is up in {time.monotonic() - launch.t0:.1f} s: orchestrator {orchestrators}, "
          f"OpenAI-compatible gateway {gateway}/v1, Redis {services[0].target}\n"
          f"  try: {ask} \"How do I read a file line by line?\"\n"
          f"  {api_key_line(recorded)}\n"
          + (f"  {tls_line(recorded)}\n" if recorded["tls_dir"] else "") +
          "  `streamrag status` shows its health, `streamrag down` stops it; a service that dies is "
          "started again")
    return 0


def restart(run_dir: Path | None, names: list[str], timeout_s: float = 300.0) -> None:
    """Stop the named services and start them again, once healthy return (StackError otherwise).

    A deliberate restart: it is not counted in `restarts`, and the supervisor leaves it alone.
    """
    run_dir = resolve_run_dir(run_dir)
    with locked(run_dir):
        state = read_state(run_dir)
        if state is None:
            raise StackError("stack", f"no stack is up (run dir {run_dir})")
        by_name = {s.name: s for s in state.services}
        unknown = [n for n in names if n not in by_name or not by_name[n].argv]
        if unknown:
            raise StackError(", ".join(unknown), "not a service this stack started")
        targets = [by_name[n] for n in names]
        stop_services(targets, timeout_s=20.0)
        launch = Launch(run_dir, state, timeout_s)
        for service in targets:
            launch.start(service, note="restarted on purpose")
        for service in targets:
            launch.wait_healthy(service)


def run_up(args: argparse.Namespace) -> int:
    """`streamrag up`."""
    return up(StackOptions.from_args(args))


def service_details(service: Service, options: dict, timeout_s: float = 2.0) -> str:
    """Key stats for `status`: KV blocks and queue for inference, kind and corpus for retrievers."""
    if service.kind == "redis":
        return "private" if service.argv else "external (not stopped by down)"
    if service.kind == "corpus":
        return f"latency {options['latency']}; {options['corpus_root']}"
    if service.kind == "orchestrator":
        return f"{options['replicas']} inference replica(s)" + orchestrator_saturation(service, timeout_s)
    if service.kind == "gateway":
        return f"OpenAI-compatible API at {service.target.removesuffix('/health')}/v1" + gateway_saturation(
            service, options, timeout_s)
    import grpc

    from protos import inference_pb2, inference_pb2_grpc, retriever_pb2, retriever_pb2_grpc

    tls = stack_client_tls(options)
    with (grpc.secure_channel(service.target, tls.channel_credentials()) if tls
          else grpc.insecure_channel(service.target)) as channel:
        try:
            if service.kind == "inference":
                stats = inference_pb2_grpc.InferenceStub(channel).GetStats(inference_pb2.GetStatsRequest(),
                                                                           timeout=timeout_s).stats
                pools = ", ".join(f"{p.name} {p.free_blocks}/{p.total_blocks}" for p in stats.pools)
                skipped = stats.counters.chunk_captures_skipped
                return (f"role {stats.role or 'both'}; policy {stats.policy}; KV free/total blocks: {pools}; "
                        f"running {stats.num_running}, waiting {stats.num_waiting}, sessions {stats.num_sessions}"
                        + (f"; blend captures skipped (no free blocks): {skipped}" if skipped else ""))
            info = retriever_pb2_grpc.RetrieverStub(channel).Describe(retriever_pb2.RetrieverDescribeRequest(),
                                                                      timeout=timeout_s).retriever_info
        except grpc.RpcError as exc:
            return f"({exc.code().name.lower()})"
    kind = retriever_pb2.RetrieverKind.Name(info.kind).removeprefix("RETRIEVER_KIND_").lower()
    collections = f"; collections {info.facts['collections']}" if info.facts.get("collections") else ""
    if info.num_documents:
        return f"{kind}; corpus {info.corpus}, {info.num_documents} documents{collections}"
    if "default_state" in info.facts:
        progress = info.facts.get("default_progress")
        return f"{kind}; default index {info.facts['default_state']}{f' ({progress})' if progress else ''}{collections}"
    return f"{kind}; starts at {info.facts.get('start_urls', '?')}"


def gateway_saturation(service, options: dict, timeout_s: float) -> str:
    """"; SATURATED (...)" when the gateway's /health says it shed requests lately, else ""."""
    import json
    import ssl
    import urllib.request

    tls = stack_client_tls(options)
    context = ssl.create_default_context(cafile=str(tls.ca)) if tls and tls.ca else None
    try:
        with urllib.request.urlopen(service.target, timeout=timeout_s, context=context) as response:
            health = json.loads(response.read())
    except (OSError, ValueError):
        return ""
    if not health.get("saturated"):
        return ""
    return (f"; SATURATED: requests shed (not started within their tenant's max_queue_s), the last "
            f"{health.get('last_shed_s_ago')} s ago")


def orchestrator_saturation(service, timeout_s: float) -> str:
    """"; SATURATED (...)" when the orchestrator's metrics say it is saturated (orchestrator/metrics.py), else ""."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from orchestrator.metrics import LAST_SHED, SATURATED

    if len(service.ports) < 2:                 # no metrics port: nothing to read
        return ""
    host = service.target.rpartition(":")[0] or "127.0.0.1"
    try:
        with urllib.request.urlopen(f"http://{host}:{service.ports[1]}/metrics", timeout=timeout_s) as response:
            samples = {(s.name, s.labels.get("reason")): s.value
                       for family in text_string_to_metric_families(response.read().decode())
                       for s in family.samples if s.name in (SATURATED, LAST_SHED)}
    except (OSError, ValueError):
        return ""
    reasons = []
    if samples.get((SATURATED, "shedding")):
        reasons.append(f"requests shed (not started within their tenant's max_queue_s), the last "
                       f"{samples.get((LAST_SHED, None), 0):.1f} s ago")
    if samples.get((SATURATED, "replicas_overloaded")):
        reasons.append("every inference replica is overloaded")
    return f"; SATURATED: {'; '.join(reasons)}" if reasons else ""


# ---------------------------------------------------------------- status and down

def add_status_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag status`."""
    add_run_dir_arg(parser)
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds each health check may take")


def run_status(args: argparse.Namespace) -> int:
    """`streamrag status`: a table of health and stats; exit 1 when something is down."""
    run_dir = resolve_run_dir(args.run_dir)
    state = read_state(run_dir)
    if state is None:
        print(f"no stack is up (run dir {run_dir}): start one with `streamrag up`")
        return 1
    options, services = state.options, state.services
    supervised = state.supervisor is not None and is_running(state.supervisor)
    rows = [("SERVICE", "PID", "ADDRESS", "HEALTH", "RESTARTS", "DETAILS")]
    down = []
    for s in services:
        if s.argv and not is_running(s):
            health = "DOWN"
            details = (f"process {s.pid} is gone" + ("; the supervisor starts it again" if supervised else "")
                       + f"; see {log_path(run_dir, s.name)}")
        elif (reason := check_health(s.check, s.target, probe_timeout(s, options, args.timeout),
                                     stack_client_tls(options))) is not None:
            health, details = "DOWN", reason
        else:
            health, details = "healthy", service_details(s, options, args.timeout)
        if health != "healthy":
            down.append(s.name)
        restarts = "-" if not s.argv else str(s.restarts) + (f" ({s.last_exit})" if s.last_exit else "")
        rows.append((s.name, str(s.pid or "-"), s.target, health, restarts, details))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)) + "  " + row[5])
    if supervised:
        print(f"supervisor: pid {state.supervisor.pid}, starts again a service that dies "
              f"(see {log_path(run_dir, 'supervisor')})")
    else:
        print("supervisor: not running, so a service that dies stays down; `streamrag up` starts what is down "
              "and the supervisor")
    print(api_key_line(options))
    if options.get("tls_dir"):
        print(tls_line(options))
    print(f"{len(services) - len(down)} of {len(services)} healthy" + (f"; down: {', '.join(down)}" if down else ""))
    return 1 if down else 0


def add_down_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag down`."""
    add_run_dir_arg(parser)
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds each service gets to stop after SIGTERM before SIGKILL (default 20)")


def run_down(args: argparse.Namespace) -> int:
    """`streamrag down`: stop the supervisor, then what `up` started; remove the pid files and the state."""
    run_dir = resolve_run_dir(args.run_dir)
    with locked(run_dir):
        state = read_state(run_dir)
        if state is None:
            print(f"no stack is up (run dir {run_dir})")
            return 0
        services = state.services
        stop_supervisor(state, args.timeout)     # first: nothing may start a service again while we stop them
        running = [s.name for s in services if s.argv and is_running(s)]
        killed = stop_in_order(services, args.timeout)
        clear_state(run_dir, services)
    external = [s.target for s in services if not s.argv]
    print(f"stopped {len(running)} service(s): {', '.join(running) or 'none were running'}"
          + (f"; killed after {args.timeout:.0f} s: {', '.join(killed)}" if killed else "")
          + (f"; left the external Redis {external[0]} running" if external else ""))
    return 0
