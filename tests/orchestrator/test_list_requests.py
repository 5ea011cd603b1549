"""ListRequests over a real orchestrator and a real Redis, and `streamrag requests`, which reads every
record through it (the CLI opens no Redis): the newest first, without their events; a limit out of
range is INVALID_ARGUMENT; Redis down is UNAVAILABLE."""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest

from orchestrator.lifecycle_store import LifecycleStore
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.auth import keyed_channel
from streamrag import cli
from streamrag.stack.plan import Service
from streamrag.stack.state import StackState, write_state
from tests.support.orchestrator import OrchestratorProcess
from tests.support.redis_server import PrivateRedis, free_port

KEY = "sk-list-requests-test"


async def record(redis_url: str) -> None:
    """Three requests, oldest first: one answered, one failed, one still retrieving."""
    async with LifecycleStore(redis_url) as store:
        for request_id, question in (("r-1", "first?"), ("r-2", "second?"), ("r-3", "third?")):
            await store.create(request_id, question, retriever="anns", streamed=True)
            await store.event(request_id, "QUEUED")
            await asyncio.sleep(0.005)          # distinct creation times
        await store.update("r-1", state="FINISHED", answer="one")
        await store.event("r-1", "DONE", total_s=0.5)
        await store.event("r-2", "ERROR", detail="boom")
        await store.update("r-2", state="FAILED", error="boom")
        await store.update("r-3", state="RETRIEVING")
        assert await store.flush(10)


@pytest.fixture(scope="module")
def orchestrator(tmp_path_factory):
    """An orchestrator process that wants KEY, over a private Redis holding three records."""
    tmp = tmp_path_factory.mktemp("list-requests")
    redis = PrivateRedis(tmp, persist=True)      # the records outlive a restart
    (tmp / "keys").write_text(KEY + "\n")
    process = None
    try:
        asyncio.run(record(redis.url))
        with pytest.MonkeyPatch.context() as env:
            env.setenv("STREAMRAG_ORCHESTRATOR_API_KEY_FILE", str(tmp / "keys"))
            process = OrchestratorProcess(redis.url, [f"127.0.0.1:{free_port()}"], log_path=tmp / "orchestrator.log")
        yield process, redis, tmp
    finally:
        if process is not None:
            process.stop()
        redis.stop()


def list_requests(address: str, limit: int = 0) -> list[orchestrator_pb2.RequestRecord]:
    with keyed_channel(address, key=KEY) as channel:
        return list(orchestrator_pb2_grpc.OrchestratorStub(channel).ListRequests(
            orchestrator_pb2.ListRequestsRequest(limit=limit), timeout=30).records)


def test_list_requests_returns_the_newest_first_without_their_events(orchestrator):
    process, _, _ = orchestrator
    records = list_requests(process.address)
    assert [(r.request_id, r.question, r.state) for r in records] == [
        ("r-3", "third?", orchestrator_pb2.REQUEST_STATE_RETRIEVING),
        ("r-2", "second?", orchestrator_pb2.REQUEST_STATE_FAILED),
        ("r-1", "first?", orchestrator_pb2.REQUEST_STATE_FINISHED)]
    assert records[1].error == "boom" and records[2].answer == "one"
    assert records[0].retriever == orchestrator_pb2.RETRIEVER_CHOICE_ANNS and records[0].streamed
    assert not any(r.events for r in records)
    assert [r.request_id for r in list_requests(process.address, limit=2)] == ["r-3", "r-2"]


@pytest.mark.parametrize("limit", [-1, 1001])
def test_a_limit_out_of_range_is_invalid_argument_and_says_the_range(orchestrator, limit):
    process, _, _ = orchestrator
    with pytest.raises(grpc.RpcError) as caught:
        list_requests(process.address, limit)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "between 0 and 1000" in caught.value.details() and str(limit) in caught.value.details()


def test_streamrag_requests_reads_through_the_local_stacks_orchestrator_with_its_key(orchestrator, tmp_path,
                                                                                      monkeypatch, capsys):
    """No --orchestrator: the stack's recorded orchestrator, dialed with the stack's key file."""
    process, _, tmp = orchestrator
    write_state(tmp_path, StackState({"api_key_file": str(tmp / "keys")},
                                     [Service("orchestrator", "orchestrator", process.address, None)]))
    monkeypatch.setenv("STREAMRAG_RUN_DIR", str(tmp_path))
    for name in ("STREAMRAG_API_KEY", "STREAMRAG_API_KEY_FILE"):
        monkeypatch.setenv(name, "")             # the stack's key is used; restored afterwards

    assert cli.main(["requests", "--limit", "2"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in listed] == [["r-3", "RETRIEVING"], ["r-2", "FAILED"]]
    assert listed[0].endswith("third?")

    assert cli.main(["requests", "r-2"]) == 0
    shown = capsys.readouterr().out
    assert "r-2  REQUEST_STATE_FAILED" in shown and "question: second?" in shown
    assert re.findall(r"^  \+ *[\d.]+s  (\S+)", shown, re.MULTILINE) == ["QUEUED", "ERROR"]   # its events

    assert cli.main(["requests", "--limit", "-1"]) == 1
    assert "error: INVALID_ARGUMENT: limit must be between 0 and 1000" in capsys.readouterr().err
    with pytest.raises(SystemExit):             # Redis is the orchestrator's alone
        cli.main(["requests", "--redis", "redis://127.0.0.1:6379/0"])


def test_with_redis_down_list_requests_is_unavailable_and_the_cli_says_so(orchestrator, monkeypatch, capsys):
    process, redis, _ = orchestrator
    monkeypatch.setenv("STREAMRAG_API_KEY", KEY)
    redis.stop()
    try:
        with pytest.raises(grpc.RpcError) as caught:
            list_requests(process.address)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "lifecycle store is unavailable" in caught.value.details()
        assert cli.main(["requests", "--orchestrator", process.address]) == 1
        assert "error: UNAVAILABLE: the lifecycle store is unavailable" in capsys.readouterr().err
    finally:
        redis.restart()
    assert [r.request_id for r in list_requests(process.address)] == ["r-3", "r-2", "r-1"]
