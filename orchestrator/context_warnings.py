"""What an Ask tells its caller about the answer's context: the one place this rule is written.

- **Falling back.** Before retrieving, an Ask that left the retriever implicit
  (`RETRIEVER_CHOICE_UNSPECIFIED`, which means the ANNS retriever) asks the ANNS retriever's
  `Describe` whether it can serve: it cannot while the default index it would search is still
  building (or failed to build), nor when it does not answer. Then the crawler is asked in its
  place, when it is configured and answers, and a warning says so; with no crawler to ask, the
  warning says that the answer has no context.
- **No silent substitution.** An Ask that named its retriever gets that retriever: when it
  fails, the warning is its failure (`retrieval_failed`), and nothing else is asked.
- **Never empty sources without a reason.** When retrieval ends with no documents and no
  warning has said why, a warning does (`no_sources`).

The pipeline (ask.py) sends each warning as an `AskEvent.warning` when it arises and lists all
of them in `AskDone.warnings`; the CLI and the gateway display them, they do not decide them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace

import grpc

from orchestrator.recording import record_retrievers, record_warning
from protos import orchestrator_pb2, retriever_pb2

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT_S = 2.0       # a retriever that cannot describe itself this fast cannot serve this Ask
IMPLICIT = orchestrator_pb2.RETRIEVER_CHOICE_UNSPECIFIED


@dataclass
class RetrievalPlan:
    """Which retriever(s) an Ask asks (`choice`, `retrievers`), and what the caller is told about it."""

    choice: int
    retrievers: list[str]
    warnings: list[str] = field(default_factory=list)


async def why_unserved(name: str, stub, collection: str) -> str | None:
    """Why retriever `name` cannot serve a search of `collection` now, or None when it can."""
    try:
        info = (await stub.Describe(retriever_pb2.RetrieverDescribeRequest(),
                                    timeout=DESCRIBE_TIMEOUT_S)).retriever_info
    except grpc.RpcError as exc:
        return f"the {name} retriever is not answering ({exc.code().name})"
    state = info.facts.get("default_state", "")
    if name == "anns" and not collection and state and state != "ready":
        progress = info.facts.get("default_progress", "")
        what = "is still building" if state == "building" else f"is {state}"
        return f"the default ANNS index {what}{f' ({progress})' if progress else ''}"
    return None


async def plan_retrieval(requested: int, choice: int, retrievers: list[str], stubs: dict,
                         collection: str = "") -> RetrievalPlan:
    """The retrievers an Ask asks: `retrievers` (for `choice`), or the crawler in the ANNS retriever's place
    when the request left the choice implicit (`requested` unset) and the ANNS retriever cannot serve."""
    if requested != IMPLICIT or retrievers != ["anns"]:
        return RetrievalPlan(choice, retrievers)
    reason = await why_unserved("anns", stubs["anns"], collection)
    if reason is None:
        return RetrievalPlan(choice, retrievers)
    crawler = stubs.get("crawler")
    crawler_down = None if crawler is None else await why_unserved("crawler", crawler, "")
    if crawler is None or crawler_down is not None:
        missing = "no crawler is configured" if crawler is None else crawler_down
        return RetrievalPlan(choice, retrievers, [f"{reason}, and {missing}: this answer has no retrieved context"])
    log.info("the anns retriever cannot serve (%s): asking the crawler", reason)
    return RetrievalPlan(orchestrator_pb2.RETRIEVER_CHOICE_CRAWLER, ["crawler"],
                         [f"{reason}: the sources come from the crawler instead (ask with a retriever named to "
                          "have only that one)"])


class ContextWarnings:
    """One Ask's warnings: each sent to the caller as it arises (`AskEvent.warning`), recorded in the
    lifecycle store (a WARNING event), and kept for `AskDone.warnings` (`all`)."""

    def __init__(self, request_id: str, store, out: asyncio.Queue) -> None:
        self.request_id = request_id
        self.store = store
        self.out = out
        self.all: list[str] = []

    async def add(self, text: str) -> None:
        self.all.append(text)
        await record_warning(self.store, self.request_id, text)
        await self.out.put(orchestrator_pb2.AskEvent(warning=text))

    async def plan(self, settings, stubs: dict):
        """`settings` (ask.AskSettings) with the retrievers to ask (`plan_retrieval`), once the request is recorded;
        the plan's warnings are sent."""
        plan = await plan_retrieval(settings.requested, settings.choice, settings.retrievers, stubs,
                                    settings.collection)
        if plan.retrievers != settings.retrievers:
            settings = replace(settings, choice=plan.choice, retrievers=plan.retrievers)
            await record_retrievers(self.store, self.request_id, plan.retrievers)
        for text in plan.warnings:
            await self.add(text)
        return settings

    async def retriever_failed(self, name: str, detail: str) -> None:
        await self.add(f"retriever {name} failed: {detail}")

    async def deadline_passed(self, deadline_s: float, pending: set[str]) -> None:
        await self.add(f"the retrieval deadline ({deadline_s:g} s) passed before {', '.join(sorted(pending))} "
                       "ended: the answer uses what arrived by then")

    async def retrieval_ended(self, retrievers: list[str], documents: int) -> None:
        """No sources without a reason: when nothing was found and no warning says why, one does."""
        if documents or not retrievers or self.all:
            return
        plural = "s" if len(retrievers) > 1 else ""
        await self.add(f"no context: the {' and '.join(retrievers)} retriever{plural} found no documents for "
                       "this question")
