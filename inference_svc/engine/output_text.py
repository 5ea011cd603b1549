"""A request's output text as its tokens arrive: incremental decoding, stop strings, and how
much of the text is safe to stream.

    text = OutputText(tokenizer.decode, stop=("\\n\\n",))
    stopped = text.add(output_token_ids)       # after each new token
    delta = text.take(final=stopped or ended)  # what the token event carries

A stop string ends the request where it starts: neither the stop string nor anything decoded
after it is part of the output (as in vLLM and OpenAI). Streaming holds text back while it
could still turn out to be a stop string: the end of the text that is a prefix of some stop
string, and an incomplete UTF-8 character (decoded as U+FFFD), wait for the next token. The
last token's event carries everything still held back, so the streamed deltas always add up
to `final`. `finish_reason` says whether the output ends with its last token.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from inference_svc.engine.request import FinishReason
from inference_svc.engine.sampler import SamplingParams

REPLACEMENT = "\ufffd"   # what decoding gives for an incomplete UTF-8 sequence


class OutputText:
    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stop = tuple(stop)
        self.text = ""                    # the decoded output so far
        self.stop_at: int | None = None   # where the first stop string starts, once one appeared
        self.stop_string: str | None = None
        self.sent = ""                    # the text streamed so far (a prefix of `final`)
        self._scanned = 0                 # text before this offset holds no stop string

    @property
    def final(self) -> str:
        """The output text: up to the first stop string, or all of it."""
        return self.text if self.stop_at is None else self.text[:self.stop_at]

    def add(self, token_ids: list[int]) -> bool:
        """Decode the output after a new token; True when a stop string has appeared."""
        if self.stop_at is not None:
            return True
        self.text = self.decode(token_ids)
        if self.stop:
            self._find_stop()
        return self.stop_at is not None

    def take(self, final: bool = False) -> str:
        """The text to stream now; `final`: the request ends with this token, send everything."""
        end = len(self.final) if final or self.stop_at is not None else self._safe_end()
        text = self.final[:end]
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""   # nothing new (or decoding changed text already sent: it cannot be unsent)
        delta, self.sent = text[len(self.sent):], text
        return delta

    def _find_stop(self) -> None:
        stable = len(self.text.rstrip(REPLACEMENT))
        for stop in self.stop:
            at = self.text.find(stop, max(0, self._scanned - len(stop) + 1), stable)
            if at != -1 and (self.stop_at is None or at < self.stop_at):
                self.stop_at, self.stop_string = at, stop
        self._scanned = stable

    def _safe_end(self) -> int:
        """Where the text stops being certain: before an incomplete character, and before a tail
        that is the start of a stop string."""
        text = self.text.rstrip(REPLACEMENT)
        held = 0
        for stop in self.stop:
            i = text.find(stop[0], max(0, len(text) - len(stop) + 1))
            while i != -1 and len(text) - i > held:
                if stop.startswith(text[i:]):
                    held = len(text) - i
                    break
                i = text.find(stop[0], i + 1)
        return len(text) - held


def finish_reason(text: OutputText, token_ids: list[int], params: SamplingParams, eos_token_ids: Collection[int],
                  room_to_grow: bool) -> FinishReason | None:
    """Why the output ends with its last token (None: it goes on): a stop token or EOS (STOP; the
    token's own text is not part of the output), a stop string in `text` (STOP; decoded here), or
    `max_tokens` reached or no room for another token (LENGTH)."""
    token = token_ids[-1]
    if token in params.stop_token_ids or (not params.ignore_eos and token in eos_token_ids):
        return FinishReason.STOP
    if text.add(token_ids):
        return FinishReason.STOP
    if len(token_ids) >= params.max_tokens or not room_to_grow:
        return FinishReason.LENGTH
    return None
