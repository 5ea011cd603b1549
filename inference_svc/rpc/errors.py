"""The one map from an error to the gRPC status that ends a call, for every RPC of the service.

Both servicers use it: the Inference RPCs (`rpc.servicer.StreamServicerBase`, on either backend)
and the Sessions RPCs (`native.sessions_servicer`). The session errors are defined here, beside
the rule that maps them, because this map sits below both backends; `native.sessions` raises
them. Bad input has a type (the engine's `EngineInputError` family, `convert.BadRequest`, an
undecodable message); anything else is a bug and ends the call with INTERNAL.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from inference_svc.engine.engine import DuplicateRequestError, EngineInputError, PromptTooLongError
from inference_svc.rpc.convert import BadRequest
from servicekit.server import UndecodableRequest


class SessionError(EngineInputError):
    """Bad input to a session call (INVALID_ARGUMENT)."""


class SessionNotFound(SessionError):
    """No such session (NOT_FOUND)."""


class SessionExists(SessionError):
    """The session id is taken (ALREADY_EXISTS)."""


class SessionLimit(SessionError):
    """Too many sessions, or no room for one (RESOURCE_EXHAUSTED)."""


class KvTransferError(EngineInputError):
    """Bad input to a KV transfer (INVALID_ARGUMENT); `inference_svc.disagg` raises these."""


class KvTransferUnknownRequest(KvTransferError):
    """Blocks, a truncate or a finish for a request this replica is not receiving (NOT_FOUND)."""


class KvTransferTooLarge(KvTransferError):
    """More blocks than the receiving pool holds (RESOURCE_EXHAUSTED)."""


class KvLayoutMismatch(KvTransferError):
    """The sender's KV layout differs from this replica's (FAILED_PRECONDITION)."""


@dataclass(frozen=True)
class ErrorStatus:
    """The status a call ends with (also put on a request's event queue to end its call)."""

    code: grpc.StatusCode
    message: str


# Most specific first: the session errors and PromptTooLongError are EngineInputErrors too.
STATUS_OF_ERROR: tuple[tuple[type[Exception] | tuple[type[Exception], ...], grpc.StatusCode], ...] = (
    ((SessionNotFound, KvTransferUnknownRequest), grpc.StatusCode.NOT_FOUND),
    ((SessionExists, DuplicateRequestError), grpc.StatusCode.ALREADY_EXISTS),
    ((SessionLimit, PromptTooLongError, KvTransferTooLarge), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (KvLayoutMismatch, grpc.StatusCode.FAILED_PRECONDITION),
    ((BadRequest, EngineInputError, UndecodableRequest), grpc.StatusCode.INVALID_ARGUMENT),
)


def status_for(exc: BaseException) -> ErrorStatus:
    """The status for an error a call raised (or a backend reported)."""
    for errors, code in STATUS_OF_ERROR:
        if isinstance(exc, errors):
            return ErrorStatus(code, str(exc))
    return ErrorStatus(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
