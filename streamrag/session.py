"""`streamrag session ...`: stateful sessions through the orchestrator's Sessions service.

    streamrag session create --instructions "..." [--retention-tokens N] [--id ID]
    streamrag session ingest ID [TEXT ...] [--file F]   (each line of F, or each TEXT, one segment; one batch)
    streamrag session ask ID "question"                 (the answer streams; says its data version)
    streamrag session flash ID "question" [--remove]    (register or remove a Flash Query)
    streamrag session watch ID                          (data updates and Flash answers, live)
    streamrag session follow ID --retriever crawler --query "..."  (a retriever's chunks become batches)
    streamrag session list | describe ID | close ID

Without `--orchestrator` every command talks to the local stack `streamrag up` started.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator

import grpc

from protos import common_pb2, retriever_pb2, retriever_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from protos.metadata import INGEST_AFTER_KEY
from servicekit.session_reissue import ResumableQuery, reissued
from streamrag.stack.addresses import (
    DEFAULT_ORCHESTRATOR,
    orchestrator_address,
    orchestrator_channel,
    stack_service_target,
)

RETRIEVERS = ("crawler", "anns", "replay")


def add_session_args(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="session_command", metavar="ACTION", required=True)

    def action(name: str, help: str, target: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help, allow_abbrev=False)
        sub.add_argument("--orchestrator", default=None,
                         help=f"host:port (default: the local stack's, else {DEFAULT_ORCHESTRATOR})")
        sub.add_argument("--timeout", type=float, default=600.0)
        sub.set_defaults(session_handler=target)
        return sub

    create = action("create", "open a session", "create")
    create.add_argument("--instructions", default="You answer questions about the data below. Answer briefly.")
    create.add_argument("--retention-tokens", type=int, default=0,
                        help="most tokens of data kept, oldest dropped first (default: the server's)")
    create.add_argument("--id", default="", help="the session id (default: the server picks one)")
    ingest = action("ingest", "add one batch of data (each TEXT or each line of --file is one segment)", "ingest")
    ingest.add_argument("session_id")
    ingest.add_argument("text", nargs="*")
    ingest.add_argument("--file", type=argparse.FileType("r"), default=None, help="'-' reads standard input")
    ask = action("ask", "ask the session a question; the answer streams", "ask")
    ask.add_argument("session_id")
    ask.add_argument("question")
    ask.add_argument("--max-tokens", type=int, default=128)
    ask.add_argument("--min-version", type=int, default=0,
                     help="answer from this data version or newer, even if its data is not prefilled yet "
                          "(default: the latest prefilled version)")
    ask.add_argument("--json", action="store_true", help="print one JSON object at the end instead")
    flash = action("flash", "register a Flash Query (answered after every batch), or --remove it", "flash")
    flash.add_argument("session_id")
    flash.add_argument("question")
    flash.add_argument("--max-tokens", type=int, default=0, help="answer length (default: the server's, 64)")
    flash.add_argument("--remove", action="store_true")
    watch = action("watch", "show data updates and Flash answers as they happen", "watch")
    watch.add_argument("session_id")
    watch.add_argument("--count", type=int, default=0, help="stop after this many Flash answers (0: never)")
    follow = action("follow", "feed the session from a retriever as its chunks arrive", "follow")
    follow.add_argument("session_id")
    follow.add_argument("--retriever", choices=RETRIEVERS, default="crawler")
    follow.add_argument("--query", required=True, help="what the retriever looks for")
    follow.add_argument("--address", default=None, help="the retriever's host:port (default: the local stack's)")
    follow.add_argument("--top-k", type=int, default=0)
    follow.add_argument("--deadline-ms", type=int, default=0)
    action("list", "every open session", "list")
    describe = action("describe", "one session's state", "describe")
    describe.add_argument("session_id")
    close = action("close", "close a session (running queries end, its KV is freed)", "close")
    close.add_argument("session_id")


def run_session(args: argparse.Namespace) -> int:
    try:
        with orchestrator_channel(orchestrator_address(args.orchestrator)) as channel:
            stub = sessions_pb2_grpc.SessionsStub(channel)
            return HANDLERS[args.session_handler](stub, args)
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


class UsageError(Exception):
    pass


def info_line(info: sessions_pb2.SessionInfo) -> str:
    flash = f", {len(info.flash_questions)} Flash Queries" if info.flash_questions else ""
    return (f"{info.session_id}  {info.state:10s} version {info.data_version}, {info.data_tokens} data tokens "
            f"in {info.segments} segments ({info.dropped_segments} dropped), retention {info.retention_tokens}, "
            f"{info.active_queries} queries running{flash}  replica {info.replica}")


def _create(stub, args) -> int:
    info = stub.CreateSession(sessions_pb2.CreateSessionRequest(
        session_id=args.id, instructions=args.instructions, retention_tokens=args.retention_tokens),
        timeout=args.timeout).session
    print(info.session_id)
    print(info_line(info), file=sys.stderr)
    return 0


def _ingest(stub, args) -> int:
    texts = list(args.text)
    if args.file is not None:
        texts += [line.rstrip("\n") for line in args.file if line.strip()]
    if not texts:
        raise UsageError("nothing to ingest: give TEXT arguments or --file")
    batch = sessions_pb2.IngestRequest(session_id=args.session_id, segments=[common_pb2.Segment(text=t) for t in texts])
    # An orchestrator dying under the call: re-issued to another, which skips the batch if it landed.
    before = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=args.session_id),
                                  timeout=args.timeout).session.data_version
    response = reissued(lambda attempt: stub.Ingest(iter([batch]), timeout=args.timeout, metadata=(
        ((INGEST_AFTER_KEY, str(before)),) if attempt else ())), what="ingest")
    print(f"data version {response.data_version}: {response.segments} segments added, {response.data_tokens} data "
          f"tokens kept ({response.dropped_segments} segments dropped by retention so far)")
    return 0


def _ask(stub, args) -> int:
    started_at = time.monotonic()
    started = done = None
    request = sessions_pb2.QueryRequest(session_id=args.session_id, question=args.question,
                                        min_data_version=args.min_version,
                                        sampling=common_pb2.SamplingParams(max_tokens=args.max_tokens))
    # An orchestrator dying mid-answer: the query is re-issued to another, nothing printed twice.
    for response in ResumableQuery(lambda r: stub.Query(r, timeout=args.timeout), request):
        kind = response.WhichOneof("kind")
        if kind == "started":
            started = response.started
        elif kind == "token" and not args.json:
            sys.stdout.write(response.token.text)
            sys.stdout.flush()
        elif kind == "done":
            done = response.done
    if done is None or started is None:
        print("error: the answer ended without a result", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - started_at
    if args.json:
        print(json.dumps({"answer": done.text, "data_version": done.data_version, "flash_hit": done.flash_hit,
                          "ttft_ms": round(done.ttft_ms, 2), "total_ms": round(done.total_ms, 2),
                          "confidence": round(done.confidence, 4), "context_tokens": started.context_tokens,
                          "shared_tokens": started.shared_tokens, "client_s": round(elapsed, 4)}))
        return 0
    if done.flash_hit:
        print(done.text, end="")
    how = ("a Flash answer" if done.flash_hit else
           f"{started.shared_tokens} of {started.context_tokens} context tokens shared with the session")
    print(f"\n\ndata version {done.data_version}; {how}; first token {done.ttft_ms:.1f} ms at the server, "
          f"{elapsed * 1e3:.0f} ms here")
    return 0


def _flash(stub, args) -> int:
    if args.remove:
        response = stub.UnregisterFlashQuery(sessions_pb2.UnregisterFlashQueryRequest(
            session_id=args.session_id, question=args.question), timeout=args.timeout)
    else:
        response = stub.RegisterFlashQuery(sessions_pb2.RegisterFlashQueryRequest(
            session_id=args.session_id, question=args.question, max_tokens=args.max_tokens), timeout=args.timeout)
    print(f"{len(response.questions)} Flash Queries:")
    for question in response.questions:
        print(f"  - {question}")
    return 0


def _watch(stub, args) -> int:
    answers = 0
    for response in stub.Subscribe(sessions_pb2.SubscribeRequest(session_id=args.session_id, replay_current=True)):
        event = response.event
        kind = event.WhichOneof("kind")
        clock = time.strftime("%H:%M:%S")
        if kind == "data_updated":
            update = event.data_updated
            print(f"[{clock}] data version {update.data_version}: {update.data_tokens} data tokens "
                  f"({update.dropped_segments} segments dropped)", flush=True)
        elif kind == "flash_ready":
            flash = event.flash_ready
            print(f"[{clock}] v{flash.data_version} {flash.question}\n    -> {flash.answer.strip()}   "
                  f"(confidence {flash.confidence:.2f}, {flash.eval_ms:.0f} ms after the batch)", flush=True)
            answers += 1
            if args.count and answers >= args.count:
                return 0
        elif kind == "closed":
            print(f"[{clock}] session closed: {event.closed.reason}", flush=True)
            return 0
    return 0


def retriever_chunks(args) -> Iterator[retriever_pb2.ContextChunk]:
    address = args.address or stack_service_target(args.retriever)
    if address is None:
        raise UsageError(f"no {args.retriever} retriever: start the stack (`streamrag up`) or give --address")
    with grpc.insecure_channel(address) as channel:
        stub = retriever_pb2_grpc.RetrieverStub(channel)
        for response in stub.Retrieve(retriever_pb2.RetrieveRequest(
                query=args.query, top_k=args.top_k, deadline_ms=args.deadline_ms), timeout=args.timeout):
            yield response.chunk


def new_documents(chunks, seen: set[str]) -> Iterator[list[common_pb2.Segment]]:
    """One batch per chunk: its documents not ingested before (a session only grows, so an ANNS
    refinement adds the documents it brings and keeps the ones it drops)."""
    from orchestrator.prompt import document_segment

    for chunk in chunks:
        fresh = [doc for doc in chunk.documents if doc.id not in seen]
        seen.update(doc.id for doc in fresh)
        if fresh:
            yield [common_pb2.Segment(text=document_segment(doc).text) for doc in fresh]


def _follow(stub, args) -> int:
    seen: set[str] = set()
    batches: list[int] = []
    failed: list[grpc.RpcError] = []    # the retriever's error (raised inside the Ingest call's iterator)

    def messages():
        try:
            for segments in new_documents(retriever_chunks(args), seen):
                batches.append(len(segments))
                print(f"batch {len(batches)}: {len(segments)} new documents", file=sys.stderr, flush=True)
                yield sessions_pb2.IngestRequest(session_id=args.session_id, segments=segments)
        except grpc.RpcError as exc:
            failed.append(exc)

    try:
        response = stub.Ingest(messages(), timeout=args.timeout)
    except grpc.RpcError:
        if not failed:
            raise
        response = None
    if failed:
        print(f"error: the {args.retriever} retriever: {failed[0].code().name}: {failed[0].details()} "
              f"({len(batches)} batches ingested before)", file=sys.stderr)
        return 1
    print(f"data version {response.data_version}: {sum(batches)} documents in {len(batches)} batches "
          f"from the {args.retriever}; {response.data_tokens} data tokens kept")
    return 0


def _list(stub, args) -> int:
    sessions = stub.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=args.timeout).sessions
    for info in sessions:
        print(info_line(info))
    if not sessions:
        print("no open sessions", file=sys.stderr)
    return 0


def _describe(stub, args) -> int:
    info = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=args.session_id),
                                timeout=args.timeout).session
    print(info_line(info))
    for question in info.flash_questions:
        print(f"  flash: {question}")
    return 0


def _close(stub, args) -> int:
    info = stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id=args.session_id),
                             timeout=args.timeout).session
    print(f"closed {info.session_id} at data version {info.data_version}")
    return 0


HANDLERS = {"create": _create, "ingest": _ingest, "ask": _ask, "flash": _flash, "watch": _watch, "follow": _follow,
            "list": _list, "describe": _describe, "close": _close}
