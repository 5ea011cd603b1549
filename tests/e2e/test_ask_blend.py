"""`streamrag ask --kv-reuse blend` end to end (real Redis, retrievers, orchestrator and the real
model): the second question reuses the passages the first one cached, at new positions, and the
answer says it is a blend (approximate), never exact."""

from __future__ import annotations

import json

import grpc
import pytest

from protos import common_pb2
from streamrag.cli import main
from tests.support.stack import ask as harness_ask

QUESTION = "How do I close a file with the with statement?"


def ask(stack, capsys, question: str, *flags: str) -> dict:
    code = main(["ask", question, "--retriever", "anns", "--max-tokens", "6", "--json",
                 "--orchestrator", f"127.0.0.1:{stack.orchestrator_port}", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_ask_with_blend_reuses_cached_passages(stack, capsys):
    first = ask(stack, capsys, QUESTION, "--kv-reuse", "blend")
    assert first["kv_reuse"] == "blend" and first["chunk_cache_lookups"] >= 1
    # a longer question moves every passage to a new position: the cached ones are blended there
    second = ask(stack, capsys, "Explain briefly, with an example: " + QUESTION, "--kv-reuse", "blend",
                 "--blend-recompute", "0.15")
    assert second["kv_reuse"] == "blend"
    assert second["chunk_cache_hits"] >= 1 and second["blend_reused_tokens"] > 0
    assert 0 < second["blend_recomputed_tokens"] < second["blend_reused_tokens"]
    exact = ask(stack, capsys, QUESTION)
    assert exact["kv_reuse"] == "exact" and exact["blend_reused_tokens"] == 0


def test_bad_blend_values_are_refused(stack, capsys):
    with pytest.raises(SystemExit) as exit_info:     # the command line refuses them before asking
        main(["ask", QUESTION, "--kv-reuse", "fuzzy"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        main(["ask", QUESTION, "--kv-reuse", "blend", "--blend-recompute", "1.5"])
    capsys.readouterr()
    with pytest.raises(grpc.RpcError) as error:     # the Ask RPC: INVALID_ARGUMENT from the replica
        harness_ask(stack.stub, QUESTION, sampling=common_pb2.SamplingParams(kv_reuse="blend", blend_recompute=1.5))
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "blend_recompute" in error.value.details()
