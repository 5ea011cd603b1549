"""`streamrag serve gateway`: the OpenAI-compatible HTTP gateway, served by uvicorn.

    streamrag serve gateway --orchestrator 127.0.0.1:50051
    STREAMRAG_API_KEY=... streamrag serve gateway --tls-cert gateway.crt --tls-key gateway.key
    python -m gateway.server ...          # the same, without the CLI package (a compose image)
"""

from __future__ import annotations

import argparse

import uvicorn

from gateway.app import GatewaySettings, build_app
from servicekit.auth import load_api_keys
from servicekit.server import configure_logging
from servicekit.tenants import load_tenants
from servicekit.tls import TlsFiles, tls_from_args

GRACE_S = 5


def uvicorn_config(app, *, host: str, port: int, tls: TlsFiles | None, max_message_bytes: int,
                   log_level: str = "info") -> uvicorn.Config:
    """How the gateway is served: HTTPS when `tls` has a certificate; WebSocket messages capped."""
    serves_tls = tls is not None and tls.serves
    return uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(), lifespan="on",
                          ssl_certfile=str(tls.cert) if serves_tls else None,
                          ssl_keyfile=str(tls.key) if serves_tls else None,
                          ws_max_size=max_message_bytes, timeout_graceful_shutdown=GRACE_S, server_header=False)


def settings_from_args(args: argparse.Namespace, tls: TlsFiles | None) -> GatewaySettings:
    if args.max_body_bytes < 1:
        raise SystemExit(f"error: --max-body-bytes must be >= 1, got {args.max_body_bytes}")
    tenants = load_tenants(getattr(args, "tenants", None), load_api_keys(args.api_key_file))
    return GatewaySettings(orchestrator=args.orchestrator,
                           api_keys=tenants.keys, tenants=tenants,
                           upstream_tls=tls if tls is not None and tls.ca is not None else None,
                           max_body_bytes=args.max_body_bytes)


def main(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    tls = tls_from_args(args)
    settings = settings_from_args(args, tls)
    config = uvicorn_config(build_app(settings), host=args.host, port=args.port, tls=tls,
                            max_message_bytes=settings.max_body_bytes, log_level=args.log_level)
    scheme = "https" if tls is not None and tls.serves else "http"
    print(f"gateway on {scheme}://{args.host}:{args.port} -> orchestrator {settings.orchestrator}"
          f"{' (API key required)' if settings.api_keys else ''}", flush=True)
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    import sys

    from gateway.server_args import add_gateway_args
    from servicekit.config import run_command

    sys.exit(run_command("python -m gateway.server", add_gateway_args, main))
