"""A refused StreamPrompt reaches the client as its status even while the client is still writing.

gRPC's asyncio client reads INTERNAL ("Internal error from Core") when the server ends a bidirectional
call during one of its writes; the servicer reads what the client still sends before it ends the call
(inference_svc/rpc/client_stream.py), so the status is the servicer's, every call, on either backend
(tests/service/test_backend_parity.py runs the hostile inputs on both). Without that read, 39 of 40 of
these calls read INTERNAL on the native backend.
"""

from __future__ import annotations

import asyncio

import grpc

from inference_svc.rpc.convert import MAX_REQUEST_ID_CHARS
from protos import inference_pb2_grpc
from tests.support.inference_calls import append_msg, finish_msg, open_msg, seg

CALLS = 12


async def refused_codes(address: str, *head) -> list[tuple[grpc.StatusCode, str]]:
    """Each call sends `head`, then twenty 20 KB appends and a finish without waiting for the server."""
    async def messages():
        for message in head:
            yield message
        for _ in range(20):
            yield append_msg(seg("more retrieved text " * 1000))
        yield finish_msg(seg("end"))

    codes = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for _ in range(CALLS):
            try:
                async for _event in stub.StreamPrompt(messages(), timeout=120):
                    pass
                codes.append((grpc.StatusCode.OK, ""))
            except grpc.aio.AioRpcError as exc:
                codes.append((exc.code(), exc.details()))
    return codes


def test_a_huge_request_id_is_invalid_argument_on_every_call_while_the_client_writes(inference):
    """Refused at open, before the rest of the call is read."""
    codes = asyncio.run(refused_codes(inference.address, open_msg("x" * (1 << 20), [seg("hi")])))
    assert {code for code, _ in codes} == {grpc.StatusCode.INVALID_ARGUMENT}, codes[:3]
    assert all(f"at most {MAX_REQUEST_ID_CHARS} characters" in details for _, details in codes)


def test_a_second_open_is_invalid_argument_on_every_call_while_the_client_writes(inference):
    """Refused mid-stream, while the servicer's reader takes the rest of the call."""
    codes = asyncio.run(refused_codes(inference.address, open_msg("", [seg("hi")]), open_msg("", [seg("again")])))
    assert {code for code, _ in codes} == {grpc.StatusCode.INVALID_ARGUMENT}, codes[:3]
    assert all("second open" in details for _, details in codes)
