"""Client channels between the services: one place for how a service dials another.

Every channel reconnects quickly to a peer that was down: gRPC's default back-off grows to
120 s, which would leave a restarted replica, retriever or orchestrator unused for minutes, so
the back-off starts at 0.5 s and is capped at 2 s. With `tls` carrying a CA, the channel dials
with TLS and verifies the server (mutual TLS when `tls.cert` is set too; see `servicekit.tls`).
With `api_key`, every call presents it (`authorization: Bearer KEY`, `servicekit.auth`).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from servicekit.auth import BearerAioInterceptor
from servicekit.tls import TlsFiles

RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 2000))


def open_channel(address: str, tls: TlsFiles | None = None,
                 options: Sequence[tuple[str, object]] = (), api_key: str | None = None) -> grpc.aio.Channel:
    """A `grpc.aio` channel to `address` with the reconnect options above (`options` add to or
    override them): TLS when `tls.ca` is set, plaintext otherwise; presenting `api_key` when given."""
    merged = list(dict([*RECONNECT_OPTIONS, *options]).items())
    interceptors = [BearerAioInterceptor(api_key)] if api_key else None
    if tls is not None and tls.ca is not None:
        return grpc.aio.secure_channel(address, tls.channel_credentials(), options=merged, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=merged, interceptors=interceptors)
