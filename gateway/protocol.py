"""The request models: the one place where bad input is refused (400 with the OpenAI error body).

Ranges are the ones the services accept (protos/inference.proto, "Limits"), narrowed to
OpenAI's where OpenAI's are narrower (temperature 0..2). OpenAI fields we do not implement are
refused when set to anything but their no-op value (`n` > 1, `tools`, `response_format` other
than text, `logprobs`, penalties, `logit_bias`, `echo`, `best_of` > 1, `suffix`); fields no
OpenAI endpoint has are ignored, as OpenAI-compatible servers do. Omitting `temperature` means
greedy decoding (the services' default), not OpenAI's 1.0.

Extension: `retrieval` ({"retriever": "anns"|"crawler"|"both", "collection": "...", "top_k": N})
runs the request through `Orchestrator.Ask`, as the model `streamrag-rag` does.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

RAG_MODEL = "streamrag-rag"
MAX_TOKENS_LIMIT = 1_048_576          # SamplingParams.max_tokens (the Ask path allows 4,096)
MAX_STOP_STRINGS, MAX_STOP_CHARS = 16, 256


def check_stop(stop: str | list[str] | None) -> list[str] | None:
    """`stop` as a list: at most 16 strings of 1 to 256 characters (the services' limits)."""
    if stop is None:
        return None
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
    if any(not 1 <= len(s) <= MAX_STOP_CHARS for s in stop):
        raise ValueError(f"each stop string has 1 to {MAX_STOP_CHARS} characters")
    return stop


class Strict(BaseModel):
    """A model that refuses fields it does not know (our own extensions and events)."""

    model_config = ConfigDict(extra="forbid")


class RetrievalOptions(Strict):
    """The `retrieval` body field: which retriever(s) and which of your collections."""

    retriever: Literal["anns", "crawler", "both"] = "anns"
    collection: str = Field("", max_length=128)
    top_k: int | None = Field(None, ge=1, le=50)


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """The sampling fields of every way in (HTTP bodies, the WebSocket's session)."""

    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None

    _stop = field_validator("stop")(check_stop)

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])

    def token_limit(self) -> int | None:
        return self.max_tokens


class GenerationRequest(Sampling):
    """What chat and text completions share: the model, streaming, sampling, retrieval."""

    model: str = Field(min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    retrieval: RetrievalOptions | None = None
    # vLLM's extension: lower runs sooner, within the caller's tenant (gateway/tenancy.py)
    priority: int | None = Field(None, strict=True, ge=-(2**31), le=2**31 - 1)

    # OpenAI fields we do not implement: {field: (its no-op values, why)}; None is always a no-op.
    UNSUPPORTED: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {
        "n": ((1,), "only n=1 is supported"),
        "presence_penalty": ((0,), "penalties are not supported"),
        "frequency_penalty": ((0,), "penalties are not supported"),
        "logit_bias": (({},), "logit_bias is not supported"),
    }

    @model_validator(mode="after")
    def _refuse_what_we_do_not_do(self) -> GenerationRequest:
        for name, (no_ops, why) in self.UNSUPPORTED.items():
            value = getattr(self, name)
            if value is not None and value not in no_ops:
                raise ValueError(f"{name}: {why}")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def uses_retrieval(self) -> bool:
        return self.model == RAG_MODEL or self.retrieval is not None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(f"only text content parts are supported, got {kind!r}")
        return content

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ResponseFormat(BaseModel):
    type: str


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    UNSUPPORTED: ClassVar = {**GenerationRequest.UNSUPPORTED,
                             "tools": (([],), "tools (function calling) are not supported"),
                             "tool_choice": (("none",), "tools (function calling) are not supported"),
                             "functions": (([],), "functions are not supported"),
                             "function_call": (("none",), "functions are not supported"),
                             "logprobs": ((False,), "logprobs are not supported"),
                             "top_logprobs": ((0,), "logprobs are not supported")}

    @model_validator(mode="after")
    def _chat_rules(self) -> ChatCompletionRequest:
        if self.response_format is not None and self.response_format.type != "text":
            raise ValueError(f"response_format: {self.response_format.type!r} is not supported (only 'text')")
        if self.messages[-1].role != "user":
            raise ValueError("messages: the last message must be the user's")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def question(self) -> str:
        """What a RAG request asks: the last user message."""
        return self.messages[-1].text


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = None

    UNSUPPORTED: ClassVar = {**GenerationRequest.UNSUPPORTED,
                             "echo": ((False,), "echo is not supported"),
                             "best_of": ((1,), "only best_of=1 is supported"),
                             "suffix": (("",), "suffix is not supported"),
                             "logprobs": ((0,), "logprobs are not supported")}

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ValueError("prompt: one prompt per request (a list of several is not supported)")
            self.prompt = prompt[0]
        if isinstance(self.prompt, list) and (not self.prompt or min(self.prompt) < 0):
            raise ValueError("prompt: token ids must be a non-empty list of ids >= 0")
        if isinstance(self.prompt, str) and not self.prompt:
            raise ValueError("prompt: must not be empty")
        if self.uses_retrieval and not isinstance(self.prompt, str):
            raise ValueError("prompt: a retrieval request asks a question: the prompt must be text")
        return self


# --- the WebSocket's client events (gateway/realtime.py) -------------------------------------
class RealtimeSession(Sampling, Strict):
    model: str | None = Field(None, min_length=1, max_length=256)
    chat: bool = True


class SessionUpdate(Strict):
    type: Literal["session.update"]
    session: RealtimeSession


class InputAppend(Strict):
    type: Literal["input.append"]
    text: str = Field(min_length=1)


class InputReplace(Strict):
    type: Literal["input.replace"]
    text: str


class InputCommit(Strict):
    type: Literal["input.commit"]


class ClientEvent(BaseModel):
    event: Annotated[SessionUpdate | InputAppend | InputReplace | InputCommit, Field(discriminator="type")]
