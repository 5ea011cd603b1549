"""API keys: who may call a service, for the HTTP gateway and for gRPC alike.

Keys come from `STREAMRAG_API_KEY` (one key) and/or a file given with `--api-key-file` (one
key per line; blank lines and `#` comments are skipped). With no key configured a service is
open, as before. A caller presents a key as a bearer token: the HTTP header or the gRPC
metadata `authorization: Bearer KEY`. Keys are compared in constant time (`hmac.compare_digest`
on SHA-256 digests, against every configured key, so neither a key's length nor which key
matched shows in the timing).

On gRPC, `ApiKeyInterceptor` answers a call without a valid key with UNAUTHENTICATED before
the servicer runs (the request does no work). `grpc.health.v1.Health` stays open, so
liveness probes (compose, `streamrag status`) need no key.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import grpc

from servicekit.config import env_default, env_name
from servicekit.tls import TlsFiles, authority_options, client_tls

API_KEY_ENV = "STREAMRAG_API_KEY"
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)
UNAUTHENTICATED_MESSAGE = "a valid API key is required (authorization: Bearer KEY)"


def add_api_key_args(parser: argparse.ArgumentParser, service: str) -> None:
    """`--api-key-file` (env `STREAMRAG_<SERVICE>_API_KEY_FILE`); `STREAMRAG_API_KEY` adds one key."""
    parser.add_argument("--api-key-file", default=env_default(service, "api_key_file", None),
                        help=f"file of accepted API keys, one per line (env {env_name(service, 'api_key_file')}); "
                             f"{API_KEY_ENV} adds one key; with neither, no key is needed")


def load_api_keys(key_file: str | Path | None, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The configured keys, `STREAMRAG_API_KEY` first, then the file's in order (duplicates dropped).
    A missing or unreadable file, or a key with whitespace inside, is a SystemExit."""
    keys = [environ[API_KEY_ENV].strip()] if environ.get(API_KEY_ENV, "").strip() else []
    if key_file:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise SystemExit(f"error: cannot read the API key file {key_file}: {exc}") from exc
        keys += [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if any(len(key.split()) != 1 for key in keys):
        raise SystemExit("error: an API key must not contain whitespace")
    return tuple(dict.fromkeys(keys))


def bearer_token(header: str | None) -> str | None:
    """The KEY of an `authorization: Bearer KEY` value (scheme case-insensitive), else None."""
    scheme, _, token = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def bearer_metadata(key: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata that presents `key` (empty when there is none)."""
    return (("authorization", f"Bearer {key}"),) if key else ()


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class ApiKeys:
    """The accepted keys. Falsy when none are configured (then every caller is accepted)."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.keys: tuple[str, ...] = tuple(keys)
        self._digests = [_digest(key) for key in self.keys]

    def __bool__(self) -> bool:
        return bool(self.keys)

    @property
    def own(self) -> str | None:
        """The key this service presents when it calls another: the first configured one."""
        return self.keys[0] if self.keys else None

    def accepts(self, token: str | None) -> bool:
        """Whether `token` is a configured key; always True when no key is configured."""
        if not self.keys:
            return True
        given = _digest(token or "")
        matched = False
        for digest in self._digests:       # every key is compared: the time does not tell which matched
            matched |= hmac.compare_digest(given, digest)
        return matched and token is not None

    def accepts_metadata(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        header = next((value for key, value in metadata or () if key == "authorization"), None)
        if isinstance(header, bytes):
            header = header.decode("utf-8", "replace")
        return self.accepts(bearer_token(header))


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without a valid key with UNAUTHENTICATED, before the servicer runs."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        if self.keys.accepts_metadata(handler_call_details.invocation_metadata):
            return handler
        return _refusal(handler)


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that aborts at once, reading nothing."""

    async def refuse_unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)

    async def refuse_stream(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
        yield  # pragma: no cover - makes this an async generator, as a streaming handler must be

    kind = f"{'stream' if handler.request_streaming else 'unary'}_{'stream' if handler.response_streaming else 'unary'}"
    make = getattr(grpc, f"{kind}_rpc_method_handler")
    return make(refuse_stream if handler.response_streaming else refuse_unary,
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


# ---------------------------------------------------------------- the caller's side

API_KEY_FILE_ENV = "STREAMRAG_API_KEY_FILE"     # a client's key in a file (`streamrag up` writes one)


def client_key(environ: Mapping[str, str] = os.environ) -> str | None:
    """The key a client presents: `STREAMRAG_API_KEY`, else the first key of `STREAMRAG_API_KEY_FILE`."""
    if environ.get(API_KEY_ENV, "").strip():
        return environ[API_KEY_ENV].strip()
    key_file = environ.get(API_KEY_FILE_ENV)
    if key_file and Path(key_file).is_file():
        return next(iter(load_api_keys(key_file, {})), None)
    return None


class _BearerClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                               grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer KEY` to every call of a channel."""

    def __init__(self, key: str) -> None:
        self._metadata = bearer_metadata(key)

    def _with_key(self, details):
        metadata = [*(details.metadata or ()), *self._metadata]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_key(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_key(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_key(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_key(details), requests)


class _Details(grpc.ClientCallDetails):
    def __init__(self, details, metadata) -> None:
        self.method, self.timeout, self.credentials = details.method, details.timeout, details.credentials
        self.wait_for_ready, self.compression = details.wait_for_ready, details.compression
        self.metadata = metadata


class _BearerAio:
    """Adds `authorization: Bearer KEY` to a `grpc.aio` call's metadata."""

    def __init__(self, key: str) -> None:
        self._metadata = bearer_metadata(key)

    def _with_key(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                          details.wait_for_ready)


class _BearerUnaryUnary(_BearerAio, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._with_key(details), request)


class _BearerUnaryStream(_BearerAio, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._with_key(details), request)


class _BearerStreamUnary(_BearerAio, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, requests):
        return await continuation(self._with_key(details), requests)


class _BearerStreamStream(_BearerAio, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, requests):
        return await continuation(self._with_key(details), requests)


def bearer_aio_interceptors(key: str) -> list[grpc.aio.ClientInterceptor]:
    """`grpc.aio` client interceptors that present `key` on every call of a channel, one per call
    kind (a `grpc.aio` channel files each interceptor under the first kind it is an instance of)."""
    return [kind(key) for kind in (_BearerUnaryUnary, _BearerUnaryStream, _BearerStreamUnary, _BearerStreamStream)]


def keyed_channel(target: str, options: Sequence[tuple[str, object]] = (), key: str | None = None,
                  tls: TlsFiles | None = None, server_name: str | None = None) -> grpc.Channel:
    """A (sync) channel to `target` that presents the client's key (`client_key()` unless given) on every call,
    over TLS when `tls` (else `servicekit.tls.client_tls()`, from the environment) names a CA (servers reached
    by address verified against `server_name`: `servicekit.tls.authority_options`)."""
    tls = tls or client_tls()
    channel = (grpc.secure_channel(target, tls.channel_credentials(), options=list(
                   dict([*authority_options(target, server_name), *options]).items()))
               if tls and tls.ca else grpc.insecure_channel(target, options=list(options)))
    key = key or client_key()
    return grpc.intercept_channel(channel, _BearerClientInterceptor(key)) if key else channel
