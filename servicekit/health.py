"""Health checks of the three kinds of service in a stack, as a function and as a command.

`check_health("grpc", "127.0.0.1:50052")` asks grpc.health.v1 Check for SERVING;
`"http"` wants a 200 from a URL; `"redis"` wants a PONG. It returns None when healthy, else a
short reason. The local stack (`streamrag up` / `status`) uses the function; each
docker-compose service health-checks itself with the command, which needs nothing beyond
`servicekit` and the packages a gRPC service already has:

    python -m servicekit.health grpc 127.0.0.1:50052
    python -m servicekit.health http http://127.0.0.1:8765/index.html
    python -m servicekit.health redis redis://127.0.0.1:6379/0
    python -m servicekit.health redis redis+sentinel://127.0.0.1:26379/mymaster/0   # the primary

Over TLS, give the files (`servicekit.tls`): `check_health("grpc", target, tls=TlsFiles(...))`
dials with TLS and verifies the service against `tls.ca`, presenting `tls.cert` where the service
wants mutual TLS; `"http"` verifies an https:// URL against `tls.ca`. The command takes the same
`--tls-cert/--tls-key/--tls-ca` flags, with the environment defaults `STREAMRAG_HEALTH_TLS_CERT`,
`..._KEY`, `..._CA` (so a container that sets them health-checks its TLS port unchanged).
"""

from __future__ import annotations

import argparse
import sys

from servicekit.tls import TlsFiles, add_tls_args, tls_from_args

CHECK_KINDS = ("grpc", "http", "redis")


def _check_grpc(target: str, timeout_s: float, tls: TlsFiles | None) -> str | None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    secure = tls is not None and tls.ca is not None
    with grpc.secure_channel(target, tls.channel_credentials()) if secure else grpc.insecure_channel(target) as channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                               timeout=timeout_s).status
        except grpc.RpcError as exc:
            return f"{exc.code().name.lower()}: {exc.details()}"
    serving = health_pb2.HealthCheckResponse.SERVING
    return None if status == serving else health_pb2.HealthCheckResponse.ServingStatus.Name(status)


def _check_http(target: str, timeout_s: float, tls: TlsFiles | None) -> str | None:
    import ssl
    import urllib.error
    import urllib.request

    context = None
    if tls is not None and tls.ca is not None and target.startswith("https:"):
        context = ssl.create_default_context(cafile=str(tls.ca))
        if tls.cert is not None and tls.key is not None:
            context.load_cert_chain(str(tls.cert), str(tls.key))
    try:
        with urllib.request.urlopen(target, timeout=timeout_s, context=context) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"


def _check_redis(target: str, timeout_s: float, tls: TlsFiles | None) -> str | None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from servicekit.redis_url import redis_client

    # redis:// or redis+sentinel:// (then the primary the Sentinels name): one try, the answer is now
    client = redis_client(target, sync=True, timeout_s=timeout_s, retry=Retry(NoBackoff(), 0))
    try:
        return None if client.ping() else "no PONG"
    finally:
        client.close()


_CHECKS = {"grpc": _check_grpc, "http": _check_http, "redis": _check_redis}


def check_health(check: str, target: str, timeout_s: float = 2.0, tls: TlsFiles | None = None) -> str | None:
    """None when the service is healthy, else a short reason ("connection refused", "NOT_SERVING").
    With `tls` (a CA at least), a gRPC or https:// service is checked over TLS."""
    if check not in _CHECKS:
        raise ValueError(f"unknown health check {check!r} (one of {', '.join(CHECK_KINDS)})")
    try:
        return _CHECKS[check](target, timeout_s, tls)
    except Exception as exc:       # refused, timed out, unreachable: the reason is all we need
        return str(getattr(exc, "reason", None) or exc) or type(exc).__name__


def probe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m servicekit.health", allow_abbrev=False,
                                     description="health check one service: exit 0 when healthy, 1 with the reason")
    parser.add_argument("check", choices=CHECK_KINDS)
    parser.add_argument("target", help="host:port (grpc), URL (http) or redis:// / redis+sentinel:// URL")
    parser.add_argument("--timeout", type=float, default=3.0)
    add_tls_args(parser, "health", ca_help="CA certificate (PEM): check over TLS, verifying the service against it")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = probe_parser().parse_args(argv)
    reason = check_health(args.check, args.target, args.timeout, tls_from_args(args))
    if reason is not None:
        print(f"{args.target}: {reason}", file=sys.stderr)
    return 0 if reason is None else 1


if __name__ == "__main__":
    sys.exit(main())
