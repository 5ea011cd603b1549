"""Calls on a running Inference service through the generated stubs, as any client makes them:
message builders (`open_msg`, `append_msg`, ...), `collect` (an answer's tokens, text, lifecycle and
done), `paced` and `held_until_all_prefilled`. The service itself: tests/support/inference.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from protos import common_pb2, inference_pb2


# --- message builders -------------------------------------------------------------------
def seg(text: str, key: str = "") -> common_pb2.Segment:
    return common_pb2.Segment(text=text, key=key)


# A streamed RAG prompt in pieces: the question, three documents (each its own key), one more to swap
# in, and the assistant's turn.
HEAD = [seg("<|im_start|>user\nQuestion: how do I read a file in Python?\nDocuments:\n")]
DOCS = [
    seg("[files] Use open() to read a file; the with statement closes it for you.\n", "files"),
    seg("[lists] A list is a mutable sequence; append() adds an item at the end.\n", "lists"),
    seg("[io] read() returns the whole content and readline() returns one line.\n", "io"),
]
OTHER = seg("[dicts] A dict maps keys to values; get() returns a default.\n", "dicts")
SUFFIX = [seg("<|im_end|>\n<|im_start|>assistant\n")]


def open_msg(request_id: str, segments: Iterable[common_pb2.Segment] = (), max_tokens: int = 8,
             **sampling: object) -> inference_pb2.StreamPromptRequest:
    params = common_pb2.SamplingParams(max_tokens=max_tokens, **sampling)
    return inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(
        open=inference_pb2.PromptOpen(request_id=request_id, sampling=params, segments=list(segments))))


def append_msg(*segments: common_pb2.Segment) -> inference_pb2.StreamPromptRequest:
    return inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(
        append=inference_pb2.PromptAppend(segments=list(segments))))


def update_msg(*segments: common_pb2.Segment) -> inference_pb2.StreamPromptRequest:
    return inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(
        update=inference_pb2.PromptReplace(segments=list(segments))))


def finish_msg(*segments: common_pb2.Segment) -> inference_pb2.StreamPromptRequest:
    return inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(
        finish=inference_pb2.PromptFinish(segments=list(segments))))


@dataclass
class Answer:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    lifecycle: list[str] = field(default_factory=list)
    done: inference_pb2.InferenceDone | None = None


def collect(responses: Iterator) -> Answer:
    answer = Answer()
    for response in responses:
        event = response.event
        kind = event.WhichOneof("kind")
        if kind == "token":
            answer.tokens.append(event.token.id)
            answer.text += event.token.text
        elif kind == "lifecycle":
            answer.lifecycle.append(common_pb2.LifecycleEventKind.Name(event.lifecycle.kind))
        elif kind == "done":
            answer.done = event.done
    return answer


def paced(messages: Iterable, gap_s: float = 0.0) -> Iterator:
    """Send messages with a pause between them, like a retriever streaming chunks."""
    for i, message in enumerate(messages):
        if i and gap_s:
            time.sleep(gap_s)
        yield message


def held_until_all_prefilled(stub, count: int, head: list, docs: list, suffix: list, *, max_tokens: int = 8,
                             prefix: str = "p", metadata=(), timeout_s: float = 300) -> dict[str, Answer]:
    """`count` StreamPrompt calls at once, each streaming `head` then `docs`, and holding its finish
    until every call has had its context on the device once (a KV_ON_GPU event). When the contexts
    together need more blocks than the pool holds, the engine must have preempted someone by then.
    Returns each call's answer by request id."""
    prefilled = [threading.Event() for _ in range(count)]
    answers: dict[str, Answer] = {}

    def messages(i: int):
        yield open_msg(f"{prefix}{i}", head, max_tokens=max_tokens)
        for doc in docs:
            yield append_msg(doc)
        for event in prefilled:
            event.wait(120)
        yield finish_msg(*suffix)

    def run(i: int) -> None:
        responses = stub.StreamPrompt(messages(i), timeout=timeout_s, metadata=metadata)

        def watch():
            for response in responses:
                event = response.event
                if (event.WhichOneof("kind") == "lifecycle"
                        and event.lifecycle.kind == common_pb2.LIFECYCLE_EVENT_KIND_KV_ON_GPU):
                    prefilled[i].set()
                yield response

        answers[f"{prefix}{i}"] = collect(watch())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers
