"""An inference replica that fails before the first token: the Ask is retried once on another
replica (which is sent the prompt so far); with no replica left the caller gets UNAVAILABLE."""

from __future__ import annotations

import grpc
import pytest

from orchestrator.prompt import preamble_key
from protos import orchestrator_pb2

NONE = orchestrator_pb2.RETRIEVER_CHOICE_NONE


def ask(stub):
    done = None
    for response in stub.Ask(orchestrator_pb2.AskRequest(question="What is the capital of France?", retriever=NONE,
                                                         max_tokens=8), timeout=120):
        if response.event.WhichOneof("kind") == "done":
            done = response.event.done
    return done


def test_a_replica_dying_before_the_first_token_is_replaced_once(two_replicas):
    stub, service, replicas, *_ = two_replicas
    dead, alive = replicas
    service.router.note_served(dead.address, preamble_key())   # prefix locality: the router's favourite
    assert service.router.choose(preamble_key()).address == dead.address
    assert ask(stub).replica == dead.address     # its chat format is now cached: the failure comes mid-stream
    dead.stop()
    done = ask(stub)
    assert done is not None and done.answer
    assert done.replica == alive.address


def test_no_replica_left_is_unavailable(two_replicas):
    stub, _, replicas, *_ = two_replicas
    for replica in replicas:
        replica.stop()
    with pytest.raises(grpc.RpcError) as err:
        ask(stub)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
