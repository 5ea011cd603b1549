"""Flags of `streamrag serve orchestrator` (no heavy imports: `--help` is instant)."""

from __future__ import annotations

import argparse

from servicekit.auth import add_api_key_args
from servicekit.config import DEFAULT_PORTS, add_service_args, env_default
from servicekit.tenants import LEASE_S, add_tenants_args
from servicekit.tls import add_tls_args


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def add_orchestrator_args(parser: argparse.ArgumentParser) -> None:
    add_service_args(parser, "orchestrator")
    env = lambda key, default: env_default("orchestrator", key, default)  # noqa: E731
    parser.add_argument("--redis", default=env("redis", f"redis://127.0.0.1:{DEFAULT_PORTS['redis']}/0"),
                        help="Redis for the lifecycle store and sessions: redis://HOST:PORT/DB, or the primary "
                             "of a Sentinel set, redis+sentinel://HOST:PORT[,HOST:PORT]/MASTER/DB")
    parser.add_argument("--inference", action="append", default=None,
                        help="an inference replica address, repeatable (default 127.0.0.1:50052); "
                             "dns:///NAME:PORT (or dns://DNS_SERVER/NAME:PORT): every address NAME resolves to, "
                             "resolved again every --dns-refresh seconds")
    parser.add_argument("--dns-refresh", type=float, default=env("dns_refresh", 5.0),
                        help="seconds between resolutions of a dns:/// --inference name")
    parser.add_argument("--anns", default=env("anns", f"127.0.0.1:{DEFAULT_PORTS['anns']}"),
                        help="ANNS retriever address ('' to disable)")
    parser.add_argument("--crawler", default=env("crawler", f"127.0.0.1:{DEFAULT_PORTS['crawler']}"),
                        help="crawler retriever address ('' to disable)")
    parser.add_argument("--replay", default=env("replay", ""), help="replay retriever address (optional)")
    parser.add_argument("--ttl", type=int, default=env("ttl", 86400), help="seconds Redis keeps a request's record")
    parser.add_argument("--router-weights", default=env("router_weights", "0.4,0.1,0.3,0.2"),
                        help="FlowGuard weights: locality,memory,queue,load")
    parser.add_argument("--log-level", default=env("log_level", "INFO"))
    add_api_key_args(parser, "orchestrator")
    add_tenants_args(parser, "orchestrator")
    parser.add_argument("--tenant-lease", type=positive_seconds, default=env("tenant_lease", LEASE_S),
                        help="seconds a request's concurrency slot (and a resume's claim) outlives its last renewal; "
                             "renewed every third of it while the request runs, so a dead orchestrator's slots "
                             "free within it (default %(default)g)")
    add_tls_args(parser, "orchestrator")
