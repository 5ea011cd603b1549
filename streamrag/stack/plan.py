"""What the local stack is: its options, its services and the order they start in.

`plan_stack` turns `StackOptions` into a list of `Service`s on the default ports plus the
offset: Redis (append-only file in `<run-dir>/redis`), the corpus web server, the ANNS
retriever, the inference replicas, the crawler (which needs the corpus server), and the
orchestrator last (it needs all of them). The orchestrator also knows a replay retriever on
50063 plus the offset (`replay_target`), which the stack does not start: `streamrag demo`
runs one there, with the retrieval it recorded. Nothing here starts a process or touches
the disk.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DEFAULT_POLICY
from inference_svc.options import DEFAULT_BACKEND
from servicekit.config import DEFAULT_PORTS, default_cache_dir, metrics_port_for
from streamrag.stack.tls import cert_name, tls_flags

HOST = "127.0.0.1"
DEFAULT_CORPUS_ROOT = Path("/usr/share/doc/python3.11/html")
MAX_REPLICAS = 9                      # inference ports 50052..50060; the ANNS retriever has 50061
CLI = [sys.executable, "-m", "streamrag.cli"]
# How each kind of service is checked (servicekit.health): grpc.health.v1 Check, an HTTP 200, or a Redis PING.
CHECKS = {"redis": "redis", "corpus": "http", "retriever": "grpc", "inference": "grpc", "orchestrator": "grpc",
          "gateway": "http", "milvus": "http"}
MILVUS_PORT, MILVUS_HEALTH_PORT = 19530, 9091   # the embedded Milvus (--anns-backend milvus): proxy, /healthz
MAX_ORCHESTRATORS = 4                 # the first on 50051, the others on 50071..50073
EXTRA_ORCHESTRATOR_PORT = 50070       # orchestrator i > 0 listens on this + i (50052.. are the replicas')
REPLAY_PORT = 50063                   # the replay retriever's default port (retriever_svc.server_args.default_port)


@dataclass
class StackOptions:
    """Everything `up` needs; `streamrag up`'s flags map onto these fields one to one."""

    replicas: int = 1
    orchestrators: int = 1             # over the same Redis; the gateway and `ask` spread asks over them
    prefill_replicas: int = 0          # with decode_replicas: disaggregated replicas instead of `replicas`
    decode_replicas: int = 0
    policy: str = DEFAULT_POLICY
    dtype: str = DEFAULT_DTYPE
    device: str = DEFAULT_DEVICE
    backend: str = DEFAULT_BACKEND
    model: Path | None = None          # None: the embedded SmolLM2-135M-Instruct
    redis: str | None = None           # a Redis URL to use instead of starting a private one
    latency: str = "none"              # the corpus server's delay per page: none, lan, web or seconds
    corpus_root: Path = DEFAULT_CORPUS_ROOT
    index: Path | None = None          # None: default_index_for(corpus_root)
    port_offset: int = 0
    free_ports: bool = False           # every port one the kernel picks (tests, or beside anything)
    timeout: float = 300.0             # seconds every service gets to become healthy
    anns_backend: str = "diskannpy"    # milvus: an embedded Milvus server (data in <run-dir>/milvus) holds the vectors
    tls_dir: Path | None = None        # mutual TLS between the services, HTTPS on the gateway (stack/tls.py)
    tenants: Path | None = None        # the tenants file (servicekit/tenants.py) of the gateway and orchestrators
    run_dir: Path | None = None        # None: $STREAMRAG_RUN_DIR or <cache>/run

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StackOptions:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def replica_roles(options: StackOptions) -> list[str]:
    """Each inference replica's `--role`: `replicas` colocated ones ("both"), or with
    --prefill-replicas/--decode-replicas that many of each (disaggregated, docs/disagg.md)."""
    if options.prefill_replicas or options.decode_replicas:
        return ["prefill"] * options.prefill_replicas + ["decode"] * options.decode_replicas
    return ["both"] * options.replicas


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
    restarts: int = 0                  # times the supervisor started it again after it died
    last_exit: str | None = None       # how it ended before the last restart

    @property
    def check(self) -> str:
        return CHECKS[self.kind]


class StackError(Exception):
    """`up` could not bring a service up; `service` names it (the message says why)."""

    def __init__(self, service: str, reason: str, log: Path | None = None) -> None:
        super().__init__(f"{service}: {reason}")
        self.service, self.reason, self.log = service, reason, log


def default_index_for(corpus_root: Path) -> Path:
    from retriever_svc.corpus.index import default_index_dir

    if corpus_root.resolve() == DEFAULT_CORPUS_ROOT.resolve():
        return default_index_dir()
    return default_cache_dir() / "index" / corpus_root.resolve().name


def replay_target(services: list[Service]) -> str | None:
    """Where this stack's orchestrator expects a replay retriever (None: a stack planned before it had one)."""
    argv = next((s.argv for s in services if s.kind == "orchestrator"), None) or []
    return argv[argv.index("--replay") + 1] if "--replay" in argv else None


def probe_timeout(service: Service, options: dict, base_s: float) -> float:
    """The corpus server delays every request, health checks too: allow for its longest delay."""
    if service.kind != "corpus":
        return base_s
    from retriever_svc.corpus.web_server import latency_profile

    return base_s + latency_profile(options["latency"]).cap_s


def orchestrator_name(i: int) -> str:
    """The stack's orchestrators: "orchestrator", then "orchestrator-1", "orchestrator-2", ..."""
    return "orchestrator" + (f"-{i}" if i else "")


def plan_stack(options: StackOptions, index_dir: Path, redis_port: int,
               free_port: Callable[[], int] | None = None, api_key_file: Path | None = None) -> list[Service]:
    """The services `up` starts, in start order, on the default ports plus `port_offset`, or with
    `options.free_ports` on ports `free_port()` gives (one call per port). With `api_key_file`, the
    orchestrator and the gateway take only callers that present a key from it."""
    offset = options.port_offset
    chosen: dict[tuple[str, int], int] = {}

    def pick(key: tuple[str, int], default: int) -> int:
        if not options.free_ports:
            return default
        if free_port is None:
            raise ValueError("free_ports needs a free_port function")
        if key not in chosen:
            while (candidate := free_port()) in chosen.values() or candidate == redis_port:
                pass
            chosen[key] = candidate
        return chosen[key]

    def port(service: str, replica: int = 0) -> int:
        extra_orchestrator = service == "orchestrator" and replica
        base = EXTRA_ORCHESTRATOR_PORT if extra_orchestrator else DEFAULT_PORTS.get(service, REPLAY_PORT)
        return pick((service, replica), base + offset + replica)

    def metrics(service: str, replica: int = 0) -> int:
        return pick((f"{service} metrics", replica), metrics_port_for(service, replica) + offset)

    def grpc_flags(service: str, replica: int = 0) -> list[str]:
        return ["--host", HOST, "--port", str(port(service, replica)),
                "--metrics-port", str(metrics(service, replica))]

    def tls(name: str, kind: str) -> list[str]:
        return tls_flags(Path(options.tls_dir), cert_name(name, kind)) if options.tls_dir else []

    serve = [*CLI, "serve"]
    keys = ["--api-key-file", str(api_key_file)] if api_key_file else []
    keys += ["--tenants", str(options.tenants)] if options.tenants else []
    corpus_url = f"http://{HOST}:{port('corpus')}/index.html"
    if options.redis:
        redis = Service("redis", "redis", options.redis, None)
    else:
        redis = Service("redis", "redis", f"redis://{HOST}:{redis_port}/0", [
            shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--bind", HOST,
            "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--dir", "redis",
            "--daemonize", "no"], ports=[redis_port])
    corpus = Service("corpus", "corpus", corpus_url, [
        *serve, "corpus", "--root", str(options.corpus_root), "--host", HOST, "--port", str(port("corpus")),
        "--latency", options.latency], ports=[port("corpus")])
    milvus: list[Service] = []
    anns_backend: list[str] = []
    if options.anns_backend == "milvus":
        proxy = pick(("milvus", 0), MILVUS_PORT + offset)
        health = pick(("milvus health", 0), MILVUS_HEALTH_PORT + offset)
        milvus = [Service("milvus", "milvus", f"http://{HOST}:{health}/healthz", [
            sys.executable, "-m", "retriever_svc.milvus.embedded", "--data", "milvus", "--port", str(proxy),
            "--health-port", str(health)], ports=[proxy, health])]
        anns_backend = ["--backend", "milvus", "--milvus-uri", f"http://{HOST}:{proxy}"]
    anns = Service("anns", "retriever", f"{HOST}:{port('anns')}", [
        *serve, "retriever", "--kind", "anns", "--index", str(index_dir), "--build-from", str(options.corpus_root),
        *anns_backend, *grpc_flags("anns"), *tls("anns", "retriever")],
        needs=[s.name for s in milvus], ports=[port("anns"), metrics("anns")])
    model = ["--model", str(options.model)] if options.model else []
    inference = [Service(f"inference-{i}", "inference", f"{HOST}:{port('inference', i)}", [
        *serve, "inference", *grpc_flags("inference", i), "--policy", options.policy, "--dtype", options.dtype,
        "--device", options.device, "--backend", options.backend, *model, "--role", role, *tls("", "inference")],
        ports=[port("inference", i), metrics("inference", i)])
        for i, role in enumerate(replica_roles(options))]
    crawler = Service("crawler", "retriever", f"{HOST}:{port('crawler')}", [
        *serve, "retriever", "--kind", "crawler", "--start-url", corpus_url, *grpc_flags("crawler"),
        *tls("crawler", "retriever")],
        needs=["corpus"], ports=[port("crawler"), metrics("crawler")])
    services = [redis, corpus, *milvus, anns, *inference, crawler]    # the slow loaders (ANNS, inference) start first
    # N orchestrators over the same Redis ("orchestrator", "orchestrator-1", ...): any one serves any ask,
    # and resumes any other's (orchestrator/resume.py).
    orchestrators = [Service(orchestrator_name(i), "orchestrator", f"{HOST}:{port('orchestrator', i)}", [
        *serve, "orchestrator", *grpc_flags("orchestrator", i), "--redis", redis.target,
        *[flag for s in inference for flag in ("--inference", s.target)],
        "--anns", anns.target, "--crawler", crawler.target, "--replay", f"{HOST}:{port('replay')}", *keys,
        *tls("orchestrator", "orchestrator")],
        needs=[s.name for s in services], ports=[port("orchestrator", i), metrics("orchestrator", i)])
        for i in range(options.orchestrators)]
    scheme = "https" if options.tls_dir else "http"
    gateway = Service("gateway", "gateway", f"{scheme}://{HOST}:{port('gateway')}/health", [
        *serve, "gateway", "--host", HOST, "--port", str(port("gateway")),
        "--orchestrator", ",".join(o.target for o in orchestrators), *keys, *tls("gateway", "gateway")],
        needs=[o.name for o in orchestrators], ports=[port("gateway")])
    return [*services, *orchestrators, gateway]
