"""The client's side of re-issued session calls and plain generations (servicekit.session_reissue,
gateway.plain_resume), against scripted calls: what is sent again, what is passed on, when it gives up."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.plain_resume import ResumableGenerate
from protos import common_pb2, inference_pb2, sessions_pb2
from protos.metadata import RESUME_KEY
from servicekit.session_reissue import ResumableQuery, reissued


class Broken(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "scripted"


def played(items):
    for item in items:
        if isinstance(item, BaseException):
            raise item
        yield item


def started(version: int) -> sessions_pb2.QueryResponse:
    return sessions_pb2.QueryResponse(started=sessions_pb2.QueryStarted(data_version=version))


def query_token(i: int) -> sessions_pb2.QueryResponse:
    return sessions_pb2.QueryResponse(token=common_pb2.GeneratedToken(id=100 + i, text=f"t{i} ", index=i))


def test_a_unary_call_is_sent_again_while_unavailable_and_another_status_is_its_result():
    attempts = []

    def call(attempt):
        attempts.append(attempt)
        if attempt < 2:
            raise Broken()
        return "ok"

    assert reissued(call) == "ok" and attempts == [0, 1, 2]
    with pytest.raises(grpc.RpcError) as caught:
        reissued(lambda attempt: (_ for _ in ()).throw(Broken(grpc.StatusCode.NOT_FOUND)))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError):
        reissued(lambda attempt: (_ for _ in ()).throw(Broken()), max_reissues=1)


def test_a_reissued_query_asks_for_the_same_data_and_passes_nothing_on_twice():
    calls = [[started(3), query_token(0), query_token(1), Broken()],
             [started(3), query_token(0), query_token(1), query_token(2),
              sessions_pb2.QueryResponse(done=sessions_pb2.QueryDone(text="t0 t1 t2 "))]]
    requests = []

    def query(request):
        requests.append(request)
        return played(calls.pop(0))

    got = list(ResumableQuery(query, sessions_pb2.QueryRequest(session_id="s", question="q")))
    assert [r.WhichOneof("kind") for r in got] == ["started", "token", "token", "token", "done"]
    assert [r.token.index for r in got if r.WhichOneof("kind") == "token"] == [0, 1, 2]
    assert requests[0].min_data_version == 0 and requests[1].min_data_version == 3
    assert requests[0].request_id == requests[1].request_id != ""


def generate_token(i: int) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(event=inference_pb2.InferenceEvent(
        token=common_pb2.GeneratedToken(id=100 + i, text=f"t{i} ", index=i)))


class GenerateScript:
    def __init__(self, *calls) -> None:
        self.calls = list(calls)
        self.sent: list[tuple[inference_pb2.GenerateRequest, tuple]] = []

    def __call__(self, request, metadata):
        self.sent.append((request, metadata))
        items = self.calls.pop(0)

        class Call:
            def cancel(self):
                pass

            async def __aiter__(self):
                for item in items:
                    if isinstance(item, BaseException):
                        raise item
                    yield item

        return Call()


def collect(generation: ResumableGenerate) -> list:
    async def run():
        return [response async for response in generation]

    return asyncio.run(run())


REQUEST = inference_pb2.GenerateRequest(request_id="g", segments=[common_pb2.Segment(text="prompt")],
                                        sampling=common_pb2.SamplingParams(max_tokens=5))


def test_a_broken_plain_generation_is_reissued_as_its_continuation():
    done = inference_pb2.GenerateResponse(event=inference_pb2.InferenceEvent(done=inference_pb2.InferenceDone(
        text="t2 ", finish_reason=common_pb2.FINISH_REASON_LENGTH)))
    script = GenerateScript([generate_token(0), generate_token(1), Broken()], [generate_token(2), done])
    got = collect(ResumableGenerate(script, REQUEST))
    assert [r.event.token.index for r in got[:-1]] == [0, 1, 2] and got[-1].event.done.text == "t0 t1 t2 "
    continued, metadata = script.sent[1]
    assert list(continued.segments[-1].token_ids.ids) == [100, 101] and continued.sampling.max_tokens == 3
    assert continued.request_id == "g" and metadata == ((RESUME_KEY, "1:2"),)


def test_nothing_left_after_the_break_ends_the_answer_without_a_call():
    script = GenerateScript([generate_token(0), generate_token(1), Broken()])
    got = collect(ResumableGenerate(script, REQUEST, stop_token_ids=(101,)))
    assert len(script.sent) == 1
    assert got[-1].event.done.finish_reason == common_pb2.FINISH_REASON_STOP and got[-1].event.done.text == "t0 t1 "
    assert got[-1].event.done.stats.generated_tokens == 2
