"""One error shape for every failure, OpenAI's, and the one table from gRPC status to HTTP status.

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": null}}

`GatewayError` carries an HTTP status and that body; the app turns it into the response (or,
once a stream has started, into its last event). A service's refusal that says when to retry (a
tenant over its limit, a request that could not start in time: trailing metadata `retry-after`
and OpenAI's `x-ratelimit-*`, orchestrator/limits.py) keeps them as the response's headers; an
answer keeps the `x-ratelimit-*` values the orchestrator sent at admission (`limit_headers`).
"""

from __future__ import annotations

from typing import Any

import grpc
from fastapi.responses import JSONResponse

from protos.metadata import RATE_LIMIT_PREFIX, RETRY_AFTER_KEY

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "invalid_request_error", 429: "rate_limit_error", 499: "client_closed_request"}
# The services' status codes (design §3) as HTTP statuses; any other code is 502.
GRPC_TO_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.ABORTED: 409,            # a resume of a request another caller is resuming
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# The one refinement: a prompt longer than the model's context is the caller's to fix (OpenAI
# answers 400 context_length_exceeded), not a reason to retry as a 429 invites.
PROMPT_TOO_LONG = "prompt too long:"


class GatewayError(Exception):
    """A failure with its HTTP status and OpenAI-style body."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, code=self.code, param=self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers or None)


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def from_grpc(exc: grpc.RpcError) -> GatewayError:
    """The HTTP error for a failed call to a service."""
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and PROMPT_TOO_LONG in details:   # Ask: "inference failed: ..."
        return GatewayError(400, details, code="context_length_exceeded")
    headers = retry_headers(exc)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and headers:
        return GatewayError(429, details, code="rate_limit_exceeded", headers=headers)
    return GatewayError(GRPC_TO_HTTP.get(code, 502), f"{code.name}: {details}", code=code.name.lower(),
                        headers=headers)


def retry_headers(exc: grpc.RpcError) -> dict[str, str]:
    """`Retry-After` and `x-ratelimit-*` from a call's trailing metadata (none: {})."""
    try:
        trailing = exc.trailing_metadata() or ()
    except Exception:          # an error raised before the call had metadata
        return {}
    return limit_headers(trailing)


def limit_headers(metadata) -> dict[str, str]:
    """`Retry-After` and `x-ratelimit-*` from call metadata (protos/metadata.py), as HTTP headers."""
    headers = {}
    for key, value in metadata or ():
        if key == RETRY_AFTER_KEY:
            headers["Retry-After"] = str(value)
        elif key.startswith(RATE_LIMIT_PREFIX):
            headers[key] = str(value)
    return headers


def model_not_found(model: str) -> GatewayError:
    return GatewayError(404, f"the model {model!r} does not exist", code="model_not_found", param="model")
