"""Service configuration from command-line flags with `STREAMRAG_*` environment defaults.

Precedence: an explicit flag beats the environment, which beats the built-in default.
`STREAMRAG_INFERENCE_PORT=50060 streamrag serve inference` and
`streamrag serve inference --port 50060` do the same thing.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Default gRPC ports per service (design: further inference replicas take 50053, 50054, ...).
DEFAULT_PORTS: dict[str, int] = {
    "orchestrator": 50051,
    "inference": 50052,
    "anns": 50061,
    "crawler": 50062,
    "corpus": 8765,
    "redis": 6379,
    "gateway": 8000,   # HTTP (the OpenAI-compatible gateway; its /metrics are on the same port)
}
# Metrics listen on 9100 + a fixed offset per service so a whole local stack never collides.
METRICS_BASE_PORT = 9100
METRICS_OFFSETS: dict[str, int] = {
    "orchestrator": 0,
    "inference": 1,  # replicas: 1 + replica index * 10
    "anns": 2,
    "crawler": 3,
    "corpus": 4,
}


def default_cache_dir() -> Path:
    """Where prepared models, indexes and profiles live: `$STREAMRAG_CACHE_DIR` or ~/.cache/streamrag."""
    env = os.environ.get("STREAMRAG_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "streamrag"


def env_name(service: str, key: str) -> str:
    """`env_name("inference", "port")` -> `STREAMRAG_INFERENCE_PORT`."""
    return f"STREAMRAG_{service}_{key}".upper().replace("-", "_")


def env_default(service: str, key: str, default: str | int | float | None) -> str | int | float | None:
    """The environment's value for `key`, converted to the default's type, else `default`."""
    raw = os.environ.get(env_name(service, key))
    if raw is None or default is None:
        return raw if raw is not None else default
    try:
        return type(default)(raw)
    except ValueError as exc:
        raise SystemExit(f"error: {env_name(service, key)}={raw!r} is not a valid {type(default).__name__}") from exc


def metrics_port_for(service: str, replica: int = 0) -> int:
    return METRICS_BASE_PORT + METRICS_OFFSETS[service] + 10 * replica


@dataclass(frozen=True)
class ServiceConfig:
    """Where one service listens."""

    service: str
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = 0  # 0: pick a free port; None: no metrics endpoint
    grace_s: float = 5.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def add_service_args(parser: argparse.ArgumentParser, service: str) -> None:
    """Add --host/--port/--metrics-port/--grace flags whose defaults come from `STREAMRAG_<SERVICE>_*`."""
    parser.add_argument("--host", default=env_default(service, "host", "127.0.0.1"),
                        help=f"listen address (env {env_name(service, 'host')})")
    parser.add_argument("--port", type=int, default=env_default(service, "port", DEFAULT_PORTS[service]),
                        help=f"gRPC port (env {env_name(service, 'port')}; 0 picks a free one)")
    parser.add_argument("--metrics-port", type=int,
                        default=env_default(service, "metrics_port", metrics_port_for(service)),
                        help=f"Prometheus metrics HTTP port (env {env_name(service, 'metrics_port')}; -1 disables)")
    parser.add_argument("--grace", type=float, default=env_default(service, "grace", 5.0),
                        help="seconds in-flight RPCs get to finish on SIGTERM")


def service_config_from_args(service: str, args: argparse.Namespace) -> ServiceConfig:
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"error: --port {args.port} is not a valid port")
    metrics = None if args.metrics_port is not None and args.metrics_port < 0 else args.metrics_port
    return ServiceConfig(service=service, host=args.host, port=args.port, metrics_port=metrics, grace_s=args.grace)


def run_command(prog: str, add_args: Callable[[argparse.ArgumentParser], None],
                handler: Callable[[argparse.Namespace], int], argv: list[str] | None = None) -> int:
    """`python -m <service module> ...`: the same flags and handler as `streamrag serve ...`, without
    the CLI package (a compose image holds only its own service's package)."""
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    add_args(parser)
    try:
        return handler(parser.parse_args(argv))
    except KeyboardInterrupt:
        return 130
