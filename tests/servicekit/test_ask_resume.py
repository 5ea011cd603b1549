"""The client's side of a resumed Ask (servicekit.ask_resume), against scripted calls: what it sends
again, what it passes on, and when it gives up."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from protos import common_pb2, orchestrator_pb2
from servicekit.ask_resume import ResumableAsk


class Broken(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "scripted"


def token(i: int) -> orchestrator_pb2.AskResponse:
    return orchestrator_pb2.AskResponse(event=orchestrator_pb2.AskEvent(
        token=common_pb2.GeneratedToken(id=100 + i, text=f"t{i} ", index=i)))


DONE = orchestrator_pb2.AskResponse(event=orchestrator_pb2.AskEvent(done=orchestrator_pb2.AskDone(answer="x")))


class Script:
    """Each call plays the next list of responses; an exception in it ends that call."""

    def __init__(self, *calls) -> None:
        self.calls = list(calls)
        self.requests: list[orchestrator_pb2.AskRequest] = []

    def __call__(self, request):
        self.requests.append(request)
        played = self.calls.pop(0)

        class Call:
            def cancel(self):
                pass

            async def __aiter__(self):
                for item in played:
                    if isinstance(item, BaseException):
                        raise item
                    yield item

        return Call()


def collect(ask: ResumableAsk) -> list:
    async def run():
        return [response async for response in ask]
    return asyncio.run(run())


def test_a_broken_stream_is_re_issued_with_what_the_caller_has_and_nothing_is_passed_on_twice():
    script = Script([token(0), token(1), Broken(grpc.StatusCode.UNAVAILABLE)],
                    [token(1), token(2), DONE])       # a server that sends one again is not believed
    ask = ResumableAsk(script, orchestrator_pb2.AskRequest(question="q", request_id="r1"))
    responses = collect(ask)
    assert [r.event.token.index for r in responses if r.event.HasField("token")] == [0, 1, 2]
    again = script.requests[1]
    assert again.request_id == "r1" and list(again.resume.token_ids) == [100, 101]
    assert again.resume.text == "t0 t1 " and again.resume.attempt == 1
    assert not script.requests[0].HasField("resume")


def test_before_the_first_token_it_is_a_plain_retry_under_the_same_id():
    script = Script([Broken(grpc.StatusCode.UNAVAILABLE)], [token(0), DONE])
    ask = ResumableAsk(script, orchestrator_pb2.AskRequest(question="q"))
    collect(ask)
    first, again = script.requests
    assert first.request_id and again.request_id == first.request_id
    assert list(again.resume.token_ids) == [] and again.resume.attempt == 1


def test_the_orchestrators_own_answer_passes_on_and_resumes_are_bounded():
    with pytest.raises(grpc.RpcError) as err:
        collect(ResumableAsk(Script([Broken(grpc.StatusCode.INVALID_ARGUMENT)]), orchestrator_pb2.AskRequest()))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    script = Script(*[[Broken(grpc.StatusCode.UNAVAILABLE)]] * 3)
    with pytest.raises(grpc.RpcError):
        collect(ResumableAsk(script, orchestrator_pb2.AskRequest(), max_reissues=2))
    assert len(script.requests) == 3
