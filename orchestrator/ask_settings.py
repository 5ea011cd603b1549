"""What an `Ask` asks, checked: `validate_ask` turns an `AskRequest` into `AskSettings` or refuses it
(`BadAsk`, the caller's INVALID_ARGUMENT) before anything is retrieved or recorded."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from protos import common_pb2, orchestrator_pb2

RETRIEVER_NAMES = {
    orchestrator_pb2.RETRIEVER_CHOICE_ANNS: ["anns"],
    orchestrator_pb2.RETRIEVER_CHOICE_CRAWLER: ["crawler"],
    orchestrator_pb2.RETRIEVER_CHOICE_BOTH: ["anns", "crawler"],
    orchestrator_pb2.RETRIEVER_CHOICE_NONE: [],
    orchestrator_pb2.RETRIEVER_CHOICE_REPLAY: ["replay"],
}
DEFAULT_TOP_K = 5
DEFAULT_DEADLINE_MS = 20_000
DEFAULT_MAX_TOKENS = 128
MAX_QUESTION_CHARS = 2000


class BadAsk(ValueError):
    pass


@dataclass(frozen=True)
class AskSettings:
    request_id: str
    question: str
    choice: int                       # orchestrator_pb2.RETRIEVER_CHOICE_*
    retrievers: list[str]
    streamed: bool
    top_k: int
    deadline_s: float
    sampling: common_pb2.SamplingParams
    retriever_options: dict[str, str]
    collection: str = ""              # the ANNS collection ("" = the retriever's default)
    resume: orchestrator_pb2.AskResume | None = None   # a re-issued Ask: what the caller already has
    requested: int = 0                # the retriever choice as asked (0: left to the default)


def validate_ask(request: orchestrator_pb2.AskRequest, available: set[str]) -> AskSettings:
    question = request.question.strip()
    if not question:
        raise BadAsk("question must not be empty")
    if len(request.question) > MAX_QUESTION_CHARS:
        raise BadAsk(f"question is {len(request.question)} characters; the limit is {MAX_QUESTION_CHARS}")
    choice = request.retriever or orchestrator_pb2.RETRIEVER_CHOICE_ANNS
    if choice not in RETRIEVER_NAMES:
        raise BadAsk(f"unknown retriever choice {request.retriever}")
    retrievers = RETRIEVER_NAMES[choice]
    missing = [name for name in retrievers if name not in available]
    if missing:
        raise BadAsk(f"retriever {', '.join(missing)} is not configured on this orchestrator")
    max_tokens = request.max_tokens or request.sampling.max_tokens or DEFAULT_MAX_TOKENS
    if not 1 <= max_tokens <= 4096:
        raise BadAsk(f"max_tokens must be in [1, 4096], got {max_tokens}")
    top_k = request.top_k or DEFAULT_TOP_K
    if not 1 <= top_k <= 50:
        raise BadAsk(f"top_k must be in [1, 50], got {request.top_k}")
    deadline_ms = request.retrieval_deadline_ms or DEFAULT_DEADLINE_MS
    if not 1 <= deadline_ms <= 600_000:
        raise BadAsk(f"retrieval_deadline_ms must be in [1, 600000], got {request.retrieval_deadline_ms}")
    sampling = common_pb2.SamplingParams()
    sampling.CopyFrom(request.sampling)
    sampling.max_tokens = max_tokens
    request_id = request.request_id or uuid.uuid4().hex
    if len(request_id) > 128 or not request_id.isprintable():
        raise BadAsk("request_id must be printable and at most 128 characters")
    if request.collection and "anns" not in retrievers:
        raise BadAsk(f"collection {request.collection!r} applies to the anns retriever; ask with it (or both)")
    resume = request.resume if request.HasField("resume") else None
    if resume is not None:
        if not request.request_id:
            raise BadAsk("resume needs the request_id of the Ask it resumes")
        if resume.attempt < 0:
            raise BadAsk(f"resume.attempt must be >= 0, got {resume.attempt}")
        if len(resume.token_ids) > max_tokens:
            raise BadAsk(f"resume has {len(resume.token_ids)} tokens, more than max_tokens {max_tokens}")
    return AskSettings(request_id, question, choice, retrievers, not request.no_stream, top_k, deadline_ms / 1000,
                       sampling, dict(request.retriever_options), request.collection, resume,
                       requested=request.retriever)
