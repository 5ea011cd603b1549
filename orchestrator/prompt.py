"""The prompt the orchestrator puts in front of the model, as segments.

    head   = chat prefix + instructions + the question        (sent with `open`)
    docs   = one segment per document, keyed by its id          (append / update as they arrive)
    suffix = the question again + the assistant turn header     (sent with `finish`)

The streamed and the non-streamed paths build exactly these segments, so the model sees
the same tokens for the same documents either way.
"""

from __future__ import annotations

from protos import common_pb2, inference_pb2

INSTRUCTIONS = (
    "You answer questions about Python using the documents below. "
    "Answer briefly and only from the documents.\n"
)
MAX_DOC_CHARS = 1200   # each document's share of the context


def head_segments(chat: inference_pb2.ChatFormat, question: str) -> list[common_pb2.Segment]:
    return [common_pb2.Segment(text=chat.prompt_prefix + chat.user_prefix + INSTRUCTIONS, key="instructions"),
            common_pb2.Segment(text=f"Question: {question}\nDocuments:\n")]


def document_segment(doc: common_pb2.Document) -> common_pb2.Segment:
    text = " ".join(doc.text.split())
    if len(text) > MAX_DOC_CHARS:
        text = text[:MAX_DOC_CHARS].rsplit(" ", 1)[0] + " ..."
    title = doc.title or doc.url or doc.id
    segment = common_pb2.Segment(text=f"[{title}] {text}\n", key=f"doc:{doc.id}")
    if doc.HasField("stability"):       # the retriever's hint travels to the engine (update mode)
        segment.stability = doc.stability
    return segment


def suffix_segments(chat: inference_pb2.ChatFormat, question: str) -> list[common_pb2.Segment]:
    return [common_pb2.Segment(text=f"Question again: {question}" + chat.user_suffix + chat.assistant_prefix)]


def preamble_key() -> str:
    """What the router treats as the shared prefix (for prefix-cache locality)."""
    return INSTRUCTIONS
