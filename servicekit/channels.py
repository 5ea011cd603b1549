"""Client channels between the services: one place for how a service dials another.

Every channel reconnects quickly to a peer that was down: gRPC's default back-off grows to
120 s, which would leave a restarted replica, retriever or orchestrator unused for minutes, so
the back-off starts at 0.5 s and is capped at 2 s. Every channel also pings its peer
(`KEEPALIVE_OPTIONS`): a peer that stops answering while its socket stays open (a stopped
process, a hung host) fails the channel's calls UNAVAILABLE ("ping timeout") within about
10 s instead of leaving them waiting; every server accepts those pings
(`SERVER_KEEPALIVE_OPTIONS`, which `servicekit.server` passes to its gRPC server). With `tls`
carrying a CA, the channel dials with TLS and verifies the server (mutual TLS when `tls.cert`
is set too; see `servicekit.tls`).
With `api_key`, every call presents it (`authorization: Bearer KEY`, `servicekit.auth`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import grpc

from servicekit.auth import bearer_aio_interceptors
from servicekit.tls import TlsFiles, authority_options

# `min_reconnect_backoff_ms` is gRPC's timeout of one connection attempt (20 s by default): an
# attempt that hangs (a peer that accepts but does not answer yet) is given up after 2 s and tried
# again, instead of keeping a peer that is back unused for up to 20 s.
RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 2000),
                     ("grpc.min_reconnect_backoff_ms", 2000))
# The longest a channel to a peer that is back waits before it dials again: the back-off cap
# plus gRPC's 20 % jitter. A caller that waits for a channel to be ready waits at least this.
RECONNECT_WITHIN_S = 2.0 * 1.2
# A ping every 5 s while calls are open; no answer within 5 s closes the connection. A stream
# that sends nothing for a while (a long prefill, a health watch) still pings:
# `max_pings_without_data` 0 lifts gRPC's limit of two pings without data, and gRPC's own
# ping timeout (`ping_timeout_ms`, 60 s by default) is the one that closes the connection.
KEEPALIVE_OPTIONS = (("grpc.keepalive_time_ms", 5000), ("grpc.keepalive_timeout_ms", 5000),
                     ("grpc.http2.ping_timeout_ms", 5000), ("grpc.http2.max_pings_without_data", 0))
# The server's side of it: pings 2.5 s apart or more, without data, are welcome (gRPC's default
# answers a second ping within 5 minutes with GOAWAY "too_many_pings", failing the calls).
SERVER_KEEPALIVE_OPTIONS = (("grpc.http2.min_ping_interval_without_data_ms", 2500),
                            ("grpc.keepalive_permit_without_calls", 1))
# For a server its clients find by DNS (`dns:///orchestrator:50051`): a client channel resolves the
# name again only when a connection closes, so a server added behind the name would get no calls
# from channels already open. The server ends each connection after about a minute (GOAWAY, with
# gRPC's jitter); calls in flight run to their end on it (no grace limit), and the client dials
# again, resolving the name afresh, so new calls spread over the servers there are now.
REDIAL_OPTIONS = (("grpc.max_connection_age_ms", 60_000),)


def open_channel(address: str, tls: TlsFiles | None = None, options: Sequence[tuple[str, object]] = (),
                 api_key: str | None = None, server_name: str | None = None,
                 interceptors: Sequence[grpc.aio.ClientInterceptor] = ()) -> grpc.aio.Channel:
    """A `grpc.aio` channel to `address` with the reconnect and keepalive options above (`options`
    add to or override them): TLS when `tls.ca` is set, plaintext otherwise; presenting `api_key` when
    given; `interceptors`: more client interceptors. Over TLS, a server reached by address (a list, an
    IP) must hold a certificate naming `server_name`, the service dialed
    (`servicekit.tls.authority_options`), unless `options` name the authority themselves."""
    merged = list(dict([*RECONNECT_OPTIONS, *KEEPALIVE_OPTIONS, *options]).items())
    interceptors = [*(bearer_aio_interceptors(api_key) if api_key else ()), *interceptors] or None
    if tls is not None and tls.ca is not None:
        named = {"grpc.default_authority", "grpc.ssl_target_name_override"} & dict(options).keys()
        if not named:                   # an authority the caller gives (a name it resolved) is the one checked
            merged = list(dict([*authority_options(address, server_name), *merged]).items())
        return grpc.aio.secure_channel(address, tls.channel_credentials(), options=merged, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=merged, interceptors=interceptors)


TARGET_SCHEMES = ("ipv4:", "ipv6:", "dns:", "unix:")


def spread_target(addresses: str | Sequence[str]) -> str:
    """One gRPC target for several servers of one service ("127.0.0.1:50051,127.0.0.1:50061", or a
    list): `ipv4:a,b` (gRPC's multi-address target; `ipv6:` for bracketed addresses) when there are
    several; a single address, or a target with its own scheme (`dns:///orchestrators:50051`, whose
    name resolves to every server), as it is. Dial it with `spread_options`."""
    parts = [a.strip() for a in (addresses.split(",") if isinstance(addresses, str) else addresses) if a.strip()]
    if not parts:
        raise ValueError("no address given")
    if len(parts) == 1 or parts[0].startswith(TARGET_SCHEMES):
        return ",".join(parts)
    scheme = "ipv6" if all(a.startswith("[") for a in parts) else "ipv4"
    return f"{scheme}:" + ",".join(parts)


def spread_options(health_service: str = "", wait_for_ready: bool = True) -> tuple[tuple[str, str], ...]:
    """The channel options that spread calls over every address of a target with gRPC's own
    `round_robin` and keep them off a server whose `grpc.health.v1` status for `health_service`
    ("": the server as a whole) is not SERVING (client-side health checking): a server that died,
    stopped answering (the keepalive above) or is shutting down gets no new call while another
    is up. With `wait_for_ready`, a call made while none is ready waits for one, within its timeout."""
    config: dict[str, object] = {"loadBalancingConfig": [{"round_robin": {}}],
                                 "healthCheckConfig": {"serviceName": health_service}}
    if wait_for_ready:
        config["methodConfig"] = [{"name": [{}], "waitForReady": True}]
    return (("grpc.service_config", json.dumps(config)),)
