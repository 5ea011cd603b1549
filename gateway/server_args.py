"""Flags of `streamrag serve gateway` (light imports: `--help` stays instant).

Every flag has a `STREAMRAG_GATEWAY_*` environment default; `STREAMRAG_API_KEY` adds one key.
The gateway has no replica list: every request goes through the orchestrator, whose router
picks the replica.
"""

from __future__ import annotations

import argparse

from servicekit.auth import add_api_key_args
from servicekit.config import DEFAULT_PORTS, env_default, env_name
from servicekit.tenants import add_tenants_args
from servicekit.tls import add_tls_args

MAX_BODY_BYTES = 1024 * 1024


def add_gateway_args(parser: argparse.ArgumentParser) -> None:
    env = lambda key, default: env_default("gateway", key, default)  # noqa: E731
    parser.add_argument("--host", default=env("host", "127.0.0.1"),
                        help=f"listen address (env {env_name('gateway', 'host')})")
    parser.add_argument("--port", type=int, default=env("port", DEFAULT_PORTS["gateway"]),
                        help=f"HTTP(S) port (env {env_name('gateway', 'port')}; 0 picks a free one)")
    parser.add_argument("--orchestrator", default=env("orchestrator", f"127.0.0.1:{DEFAULT_PORTS['orchestrator']}"),
                        help="the orchestrator's address: RAG requests are its Ask; plain chats, completions and the "
                             "WebSocket its Inference service, which routes them to a replica and records them")
    parser.add_argument("--max-body-bytes", type=int, default=env("max_body_bytes", MAX_BODY_BYTES),
                        help="largest request body (and WebSocket message) accepted; larger ones get 413")
    parser.add_argument("--log-level", default=env("log_level", "INFO"))
    add_api_key_args(parser, "gateway")
    add_tenants_args(parser, "gateway")
    add_tls_args(parser, "gateway", ca_help="CA certificate (PEM): dial the orchestrator with TLS "
                                            "and verify it (mutual TLS with --tls-cert/--tls-key)")

