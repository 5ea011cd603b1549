"""The gateway's rules without a stack: prompt segments, streamed-context replace, keys, the
gRPC-to-HTTP table, TLS flags."""

from __future__ import annotations

import argparse

import grpc
import pytest

from gateway.chat_prompt import StreamedContext, chat_segments, transcript
from gateway.errors import from_grpc
from protos import inference_pb2
from servicekit.auth import API_KEY_ENV, ApiKeys, bearer_token, load_api_keys
from servicekit.tls import tls_from_args

CHAT = inference_pb2.ChatFormat(prompt_prefix="<s>", user_prefix="[U]", user_suffix="[/U]", assistant_prefix="[A]")


def test_one_user_message_is_one_segment_between_head_and_suffix():
    assert [s.text for s in chat_segments(CHAT, [("user", "Hi")])] == ["<s>[U]", "Hi", "[/U][A]"]
    assert chat_segments(CHAT, [("user", "Hi")])[0].key == "chat:head"


def test_a_conversation_is_a_transcript_in_one_user_turn():
    messages = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Capital of France?")]
    assert transcript(messages) == ["System: Be brief.\n", "User: Hi\n", "Assistant: Hello!\n",
                                    "User: Capital of France?"]


def test_a_replace_keeps_the_segments_the_new_text_still_starts_with():
    context = StreamedContext()
    context.append("The cat")
    context.append(" sat")
    assert [s.text for s in context.replace("The cat sat on the mat")] == ["The cat", " sat", " on the mat"]
    assert [s.text for s in context.replace("The cat sat")] == ["The cat", " sat"]
    assert [s.text for s in context.replace("The cats")] == ["The cat", "s"]
    assert [s.text for s in context.replace("A dog")] == ["A dog"]
    assert context.replace("") == [] and context.text == ""


def test_keys_are_bearer_tokens_compared_against_every_key():
    keys = ApiKeys(["k1", "k2"])
    assert keys.accepts("k1") and keys.accepts("k2")
    assert not keys.accepts("k3") and not keys.accepts(None) and not keys.accepts("")
    assert ApiKeys([]).accepts(None) and not ApiKeys([])
    assert bearer_token("Bearer k1") == "k1" and bearer_token("bearer  k1 ") == "k1"
    assert bearer_token("Basic k1") is None and bearer_token("Bearer") is None and bearer_token(None) is None
    assert keys.accepts_metadata([("authorization", "Bearer k2")]) and not keys.accepts_metadata([])


def test_keys_come_from_the_environment_then_the_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# team keys\nk-file-1\n\n  k-file-2  \nk-env\n")
    assert load_api_keys(path, {API_KEY_ENV: "k-env"}) == ("k-env", "k-file-1", "k-file-2")
    assert load_api_keys(None, {}) == ()
    with pytest.raises(SystemExit, match="cannot read"):
        load_api_keys(tmp_path / "missing", {})
    path.write_text("two words\n")
    with pytest.raises(SystemExit, match="whitespace"):
        load_api_keys(path, {})


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "why") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(("code", "status"), [
    (grpc.StatusCode.INVALID_ARGUMENT, 400), (grpc.StatusCode.NOT_FOUND, 404), (grpc.StatusCode.UNAUTHENTICATED, 401),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 429), (grpc.StatusCode.UNAVAILABLE, 503),
    (grpc.StatusCode.DEADLINE_EXCEEDED, 504), (grpc.StatusCode.INTERNAL, 502), (grpc.StatusCode.ALREADY_EXISTS, 502),
])
def test_each_grpc_status_has_one_http_status(code, status):
    error = from_grpc(_Failed(code))
    assert error.status == status and error.body()["error"]["code"] == code.name.lower()


def test_a_prompt_longer_than_the_context_is_the_callers_400():
    error = from_grpc(_Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "prompt too long: 9000 tokens"))
    assert error.status == 400 and error.code == "context_length_exceeded"


def test_tls_flags_are_checked(tmp_path):
    cert = tmp_path / "a.crt"
    cert.write_text("x")
    flags = lambda **kw: argparse.Namespace(**{"tls_cert": None, "tls_key": None, "tls_ca": None, **kw})  # noqa: E731
    assert tls_from_args(flags()) is None
    with pytest.raises(SystemExit, match="go together"):
        tls_from_args(flags(tls_cert=str(cert)))
    with pytest.raises(SystemExit, match="no such file"):
        tls_from_args(flags(tls_ca=str(tmp_path / "missing.crt")))
    assert tls_from_args(flags(tls_ca=str(cert))).ca == cert


async def test_a_channel_with_a_key_presents_it_on_every_kind_of_call():
    """servicekit.channels.open_channel(api_key=...) against a real retriever that wants a key: a
    streamed Retrieve passes with the key, and is refused with another or none."""
    from protos import retriever_pb2, retriever_pb2_grpc
    from retriever_svc.replay.backend import ReplayBackend
    from servicekit.channels import open_channel
    from tests.support.retrievers import serving_retriever
    from tests.support.stack import SLOW_TRACE

    request = retriever_pb2.RetrieveRequest(query="how do files work", top_k=2)
    async with serving_retriever(ReplayBackend(SLOW_TRACE, name="slow"), "replay", api_keys=("k1",)) as served:
        refused = grpc.StatusCode.UNAUTHENTICATED
        for key, code in (("k1", None), ("k2", refused), (None, refused)):
            channel = open_channel(served.address, api_key=key)
            try:
                call = retriever_pb2_grpc.RetrieverStub(channel).Retrieve(request, timeout=30)
                first = await anext(aiter(call))
                assert code is None and first.chunk.documents
                call.cancel()
            except grpc.RpcError as exc:
                assert exc.code() == code, (key, exc.details())
            finally:
                await channel.close()


def test_the_gateway_has_no_replica_list(capsys):
    from gateway.server_args import add_gateway_args

    parser = argparse.ArgumentParser()
    add_gateway_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--orchestrator", "127.0.0.1:50051", "--inference", "127.0.0.1:50052"])
    assert "unrecognized arguments: --inference" in capsys.readouterr().err
