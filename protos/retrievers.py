"""The retriever names users type (`--retriever anns`, the gateway's `"retriever": "both"`) and the
`RetrieverChoice` each one is on the wire, written once for every client of the Orchestrator."""

from __future__ import annotations

from protos import orchestrator_pb2

RETRIEVER_CHOICES: dict[str, int] = {
    "anns": orchestrator_pb2.RETRIEVER_CHOICE_ANNS,
    "crawler": orchestrator_pb2.RETRIEVER_CHOICE_CRAWLER,
    "both": orchestrator_pb2.RETRIEVER_CHOICE_BOTH,
    "none": orchestrator_pb2.RETRIEVER_CHOICE_NONE,
    "replay": orchestrator_pb2.RETRIEVER_CHOICE_REPLAY,
}
# The names that retrieve from a live retriever (ANNS, the crawler or both): what a load generator asks with.
LIVE_RETRIEVERS: tuple[str, ...] = ("anns", "crawler", "both")

