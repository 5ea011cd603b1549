"""`streamrag requests`: the lifecycles the orchestrator recorded, read through it (ListRequests for the
newest requests, GetRequest for one request's events), so the CLI never opens Redis. Without
`--orchestrator` it talks to the local stack `streamrag up` started (with its key and TLS)."""

from __future__ import annotations

import argparse
import sys

import grpc

from protos import orchestrator_pb2, orchestrator_pb2_grpc
from streamrag.stack.addresses import DEFAULT_ORCHESTRATOR, orchestrator_address, orchestrator_channel

TIMEOUT_S = 30.0


def add_requests_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("request_id", nargs="?", help="show one request's lifecycle (default: list recent ones)")
    parser.add_argument("--orchestrator", default=None,
                        help=f"host:port (default: the local stack's, else {DEFAULT_ORCHESTRATOR})")
    parser.add_argument("--limit", type=int, default=0, help="how many of the newest to list (default: the "
                                                              "orchestrator's)")
    parser.add_argument("--tenant", default="", metavar="NAME",
                        help="only this tenant's requests (the tenants file's name, docs/gateway.md)")


def state_name(state: int) -> str:
    return orchestrator_pb2.RequestState.Name(state).removeprefix("REQUEST_STATE_")


def print_record(record: orchestrator_pb2.RequestRecord) -> None:
    """One request's lifecycle: its state, question, each event (time from the first) and the answer."""
    print(f"{record.request_id}  {orchestrator_pb2.RequestState.Name(record.state)}  replica {record.replica}")
    print(f"question: {record.question}")
    if record.tenant:
        print(f"tenant: {record.tenant}  priority {record.priority}")
    first = record.events[0].unix_ms if record.events else 0
    for event in record.events:
        fields = " ".join(f"{k}={v}" for k, v in sorted(event.fields.items()))
        print(f"  +{(event.unix_ms - first) / 1000:8.3f}s  {event.kind:22s} {fields}")
    if record.answer:
        print(f"answer: {record.answer}")


def run_requests(args: argparse.Namespace) -> int:
    try:
        with orchestrator_channel(orchestrator_address(args.orchestrator)) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
            if args.request_id:
                print_record(stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=args.request_id),
                                             timeout=TIMEOUT_S).record)
                return 0
            records = stub.ListRequests(orchestrator_pb2.ListRequestsRequest(limit=args.limit, tenant=args.tenant),
                                        timeout=TIMEOUT_S).records
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    for record in records:
        tenant = f"{record.tenant:12s} " if args.tenant or record.tenant else ""
        print(f"{record.request_id}  {state_name(record.state):10s} {tenant}{record.question[:70]}")
    return 0
