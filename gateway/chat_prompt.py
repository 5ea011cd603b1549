"""Prompts as segments, in the served model's chat format (`Inference.Describe` → `ChatFormat`).

The format's pieces describe one user turn:

    head   = prompt_prefix + user_prefix                      (one segment, key "chat:head")
    body   = the user's text, one segment per message / input
    suffix = user_suffix + assistant_prefix                   (one segment)

One user message is its own body segment. A conversation (system or earlier turns) cannot be
spelled with those pieces, so it is written into the one user turn as a transcript, one
segment per message: "System: ...\\n", "User: ...\\n", "Assistant: ...\\n", and the last
"User: ..." without the newline. The engine tokenizes each segment on its own (design §3), so
the same messages always give the same tokens.

`StreamedContext` keeps the WebSocket's growing input as segments: an append adds one, and a
replace keeps the leading segments whose texts the new text still starts with (their tokens,
and so their KV, stay valid) and puts the rest of the new text in one new segment.
"""

from __future__ import annotations

from collections.abc import Sequence

from protos import common_pb2, inference_pb2

ROLE_LABELS = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}


def head_segments(chat: inference_pb2.ChatFormat) -> list[common_pb2.Segment]:
    text = chat.prompt_prefix + chat.user_prefix
    return [common_pb2.Segment(text=text, key="chat:head")] if text else []


def suffix_segments(chat: inference_pb2.ChatFormat) -> list[common_pb2.Segment]:
    text = chat.user_suffix + chat.assistant_prefix
    return [common_pb2.Segment(text=text)] if text else []


def text_segments(texts: Sequence[str]) -> list[common_pb2.Segment]:
    return [common_pb2.Segment(text=text) for text in texts if text]


def transcript(messages: Sequence[tuple[str, str]]) -> list[str]:
    """The body texts of (role, text) messages, the last one the user's."""
    if len(messages) == 1:
        return [messages[0][1]]
    lines = [f"{ROLE_LABELS[role]}: {text}\n" for role, text in messages[:-1]]
    return [*lines, f"{ROLE_LABELS[messages[-1][0]]}: {messages[-1][1]}"]


def chat_segments(chat: inference_pb2.ChatFormat, messages: Sequence[tuple[str, str]]) -> list[common_pb2.Segment]:
    """The whole prompt of a chat request."""
    return [*head_segments(chat), *text_segments(transcript(messages)), *suffix_segments(chat)]


class StreamedContext:
    """The context texts of a streamed prompt, as the engine holds them (head and suffix apart)."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def append(self, text: str) -> list[common_pb2.Segment]:
        """The segments of an `append`."""
        self.texts.append(text)
        return text_segments([text])

    def replace(self, text: str) -> list[common_pb2.Segment]:
        """The complete segment list of an `update` whose context reads `text`."""
        kept, offset = 0, 0
        for old in self.texts:
            if not text.startswith(old, offset):
                break
            kept, offset = kept + 1, offset + len(old)
        self.texts = [*self.texts[:kept], *([text[offset:]] if text[offset:] else [])]
        return text_segments(self.texts)
