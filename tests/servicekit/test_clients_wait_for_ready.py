"""Clients of the orchestrator wait for it within their deadline (gRPC's wait_for_ready) instead of
failing at once while it is down or restarting: with nothing listening yet, a call ends by its
deadline (DEADLINE_EXCEEDED), not at once with UNAVAILABLE. Real gRPC channels on loopback."""

from __future__ import annotations

import asyncio

import grpc

from gateway.upstream import Upstream
from protos import inference_pb2
from streamrag.ask import run_ask
from streamrag.cli import build_parser
from tests.support.redis_server import free_port


def test_streamrag_ask_waits_for_an_orchestrator_that_is_not_up_yet(capsys):
    args = build_parser().parse_args(["ask", "--orchestrator", f"127.0.0.1:{free_port()}", "--timeout", "1",
                                      "How do I close a file?"])
    assert run_ask(args) == 1
    err = capsys.readouterr().err
    assert "error: DEADLINE_EXCEEDED" in err and "UNAVAILABLE" not in err


def test_the_gateway_upstream_waits_for_an_orchestrator_that_is_not_up_yet():
    async def describe() -> grpc.StatusCode:
        upstream = Upstream(f"127.0.0.1:{free_port()}")
        await upstream.start()
        try:
            await upstream.inference.Describe(inference_pb2.DescribeRequest(), timeout=1)
        except grpc.RpcError as exc:
            return exc.code()
        finally:
            await upstream.close()
        raise AssertionError("Describe answered with nothing listening")

    assert asyncio.run(describe()) is grpc.StatusCode.DEADLINE_EXCEEDED
