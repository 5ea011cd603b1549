"""Locust load test of the HTTP gateway: streaming chat completions, as OpenAI clients send them.

Each simulated user has its own `openai` client on the gateway and asks questions from
`load_tests/questions.txt` (shuffled per user) as streamed chat completions, by default on
`streamrag-rag` (an Ask with retrieval; `--chat-model NAME` for plain chats on the served
model), waiting a random 1-3 s between requests. Each request reports two locust entries
(type `http`):

    chat stream TTFT      from the call to the first content chunk
    chat stream total     from the call to the end of the stream ("Average size": answer bytes)

A failed request (an HTTP error, a stream error event) is one failure on its total row.

    .venv/bin/locust -f load_tests/locust_gateway.py --headless -u 4 -r 1 -t 2m \\
        --host http://127.0.0.1:8000 --csv out/gateway --chat-max-tokens 64

Options (each also read from its environment variable): --chat-model (LOCUST_CHAT_MODEL),
--chat-max-tokens (LOCUST_CHAT_MAX_TOKENS), --chat-retriever anns|crawler|both
(LOCUST_CHAT_RETRIEVER), --chat-questions FILE (LOCUST_CHAT_QUESTIONS), --chat-api-key
(LOCUST_CHAT_API_KEY, default $STREAMRAG_API_KEY), --chat-wait-min/-max (LOCUST_CHAT_WAIT_MIN/MAX),
--chat-seed N (LOCUST_CHAT_SEED: user i shuffles its questions and draws its waits with seed N, i;
default: unseeded).
When locust stops a user mid-stream, its response is closed: the gateway cancels the gRPC
call and the engine frees the request's KV blocks.
"""

from __future__ import annotations

import itertools
import os
import random
import time

import openai
from locust import User, events, task

from load_tests.gateway_bench import QUESTIONS, RAG_MODEL, read_questions
from servicekit.auth import API_KEY_ENV
from servicekit.config import DEFAULT_PORTS


@events.init_command_line_parser.add_listener
def add_chat_options(parser) -> None:
    parser.add_argument("--chat-model", default=RAG_MODEL, env_var="LOCUST_CHAT_MODEL",
                        help="model of every request (streamrag-rag: an Ask with retrieval)")
    parser.add_argument("--chat-max-tokens", type=int, default=64, env_var="LOCUST_CHAT_MAX_TOKENS")
    parser.add_argument("--chat-retriever", choices=["anns", "crawler", "both"], default="anns",
                        env_var="LOCUST_CHAT_RETRIEVER", help="the retrieval field of RAG requests")
    parser.add_argument("--chat-questions", default=str(QUESTIONS), env_var="LOCUST_CHAT_QUESTIONS")
    parser.add_argument("--chat-api-key", default=os.environ.get(API_KEY_ENV, ""), env_var="LOCUST_CHAT_API_KEY")
    parser.add_argument("--chat-wait-min", type=float, default=1.0, env_var="LOCUST_CHAT_WAIT_MIN")
    parser.add_argument("--chat-wait-max", type=float, default=3.0, env_var="LOCUST_CHAT_WAIT_MAX")
    parser.add_argument("--chat-seed", type=int, default=None, env_var="LOCUST_CHAT_SEED")


class ChatCompletionsUser(User):
    """One OpenAI client streaming chat completions from the gateway."""

    host = f"http://127.0.0.1:{DEFAULT_PORTS['gateway']}"
    numbers = itertools.count()

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.model, self.max_tokens = options.chat_model, options.chat_max_tokens
        self.extra = {"retrieval": {"retriever": options.chat_retriever}} if self.model == RAG_MODEL else {}
        self.wait_range = (options.chat_wait_min, max(options.chat_wait_min, options.chat_wait_max))
        seed = options.chat_seed
        self.rng = random.Random(f"{seed}-{next(self.numbers)}") if seed is not None else random.Random()
        questions = read_questions(options.chat_questions)
        self.rng.shuffle(questions)
        self.questions = itertools.cycle(questions)
        self.client = openai.OpenAI(base_url=f"{self.host.rstrip('/')}/v1", api_key=options.chat_api_key or "none",
                                    max_retries=0, timeout=600)

    def on_stop(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()              # closes a stream still open: the gateway cancels its call

    def wait_time(self) -> float:
        return self.rng.uniform(*self.wait_range)

    @task
    def stream_chat(self) -> None:
        question = next(self.questions)
        context = {"question": question, "model": self.model}
        started, first, answer = time.perf_counter(), None, []
        try:
            stream = self.client.chat.completions.create(
                model=self.model, stream=True, max_tokens=self.max_tokens,
                messages=[{"role": "user", "content": question}], extra_body=self.extra)
            with stream:
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        first = first or time.perf_counter()
                        answer.append(chunk.choices[0].delta.content)
        except openai.OpenAIError as exc:
            self.fire("chat stream total", started, time.perf_counter(), context, exception=exc)
            return
        ended = time.perf_counter()
        if first is not None:
            self.fire("chat stream TTFT", started, first, context)
        self.fire("chat stream total", started, ended, context, length=len("".join(answer).encode()))

    def fire(self, name: str, started: float, ended: float, context: dict, *, length: int = 0,
             exception: BaseException | None = None) -> None:
        self.environment.events.request.fire(request_type="http", name=name, response_time=(ended - started) * 1000,
                                             response_length=length, exception=exception, context=dict(context))
