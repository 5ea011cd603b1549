"""Locust load test of `Orchestrator.Ask` over gRPC, streaming and non-streaming.

Each simulated user opens its own gRPC channel to the orchestrator and asks questions from
`load_tests/questions.txt` (shuffled per user), streaming or not in a set proportion, waiting
a random 1-3 s between asks. Every Ask is reported to locust as these request entries (type
`grpc`), so they appear as rows in the stats table, the CSV files and the HTML report:

    Ask stream TTFT                       client-side: from the call to the first answer token
    Ask stream TTFT after retrieval       server-side: from the end of retrieval to the first token
                                          (the paper's TTFT; AskDone.ttft_from_retrieval_end_s, floored at 0)
    Ask stream total                      client-side: from the call to the final `done` event
    Ask no-stream TTFT / ... / total      the same for the non-streaming baseline (`no_stream`)

One Ask adds one row each to the three entries of its mode, so the "Aggregated" row counts
entries, not Asks: read requests/s and failures from the `... total` rows. A failed Ask
(a gRPC error, or a stream that ends without `done`) is one failure on its `... total` row;
its TTFT rows get nothing. "Average size" on a total row is the answer's length in bytes.

Headless run against the local stack (`streamrag up`; the orchestrator on 127.0.0.1:50051):

    .venv/bin/locust -f load_tests/locustfile.py --headless -u 3 -r 1 -t 2m \\
        --csv out/locust --html out/locust.html --ask-retriever anns --ask-stream-share 0.5

Options (each also read from its environment variable; `locust -f load_tests/locustfile.py
--help` lists them under "Custom options"):

    --host ADDR               orchestrator address, default 127.0.0.1:50051 (LOCUST_HOST)
    --ask-retriever NAME      anns | crawler | both | none, default anns (LOCUST_ASK_RETRIEVER)
    --ask-stream-share X      share of streaming asks in [0, 1], default 0.5 (LOCUST_ASK_STREAM_SHARE)
    --ask-questions FILE      one question per line, # comments (LOCUST_ASK_QUESTIONS)
    --ask-max-tokens N        answer length cap, default 64 (LOCUST_ASK_MAX_TOKENS)
    --ask-timeout S           per-Ask gRPC deadline, default 300 (LOCUST_ASK_TIMEOUT)
    --ask-wait-min/-max S     think time between asks, default 1 and 3 (LOCUST_ASK_WAIT_MIN/MAX)

Locust runs users as gevent greenlets, so grpc is switched to gevent before any channel is
made (`grpc.experimental.gevent.init_gevent()`); without it one blocked stream would stall
every user. When locust stops a user mid-Ask, its call is cancelled (the orchestrator then
aborts the request and the engine frees its KV blocks) and its channel closed.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import grpc
import grpc.experimental.gevent as grpc_gevent
from locust import User, events, task

from protos import orchestrator_pb2, orchestrator_pb2_grpc
from protos.retrievers import LIVE_RETRIEVERS, RETRIEVER_CHOICES
from servicekit.auth import keyed_channel
from servicekit.config import DEFAULT_PORTS

grpc_gevent.init_gevent()

DEFAULT_TARGET = f"127.0.0.1:{DEFAULT_PORTS['orchestrator']}"
DEFAULT_QUESTIONS = Path(__file__).with_name("questions.txt")


@events.init_command_line_parser.add_listener
def add_ask_options(parser) -> None:
    parser.add_argument("--ask-retriever", choices=[*LIVE_RETRIEVERS, "none"], default="anns",
                        env_var="LOCUST_ASK_RETRIEVER",
                        help="retriever(s) the orchestrator uses for every Ask")
    parser.add_argument("--ask-stream-share", type=float, default=0.5, env_var="LOCUST_ASK_STREAM_SHARE",
                        help="share of asks that stream context (the rest set no_stream), in [0, 1]")
    parser.add_argument("--ask-questions", default=str(DEFAULT_QUESTIONS), env_var="LOCUST_ASK_QUESTIONS",
                        help="file with one question per line (# comments)")
    parser.add_argument("--ask-max-tokens", type=int, default=64, env_var="LOCUST_ASK_MAX_TOKENS",
                        help="most answer tokens per Ask")
    parser.add_argument("--ask-timeout", type=float, default=300.0, env_var="LOCUST_ASK_TIMEOUT",
                        help="gRPC deadline of one Ask, seconds")
    parser.add_argument("--ask-wait-min", type=float, default=1.0, env_var="LOCUST_ASK_WAIT_MIN",
                        help="least think time between asks, seconds")
    parser.add_argument("--ask-wait-max", type=float, default=3.0, env_var="LOCUST_ASK_WAIT_MAX",
                        help="most think time between asks, seconds")


def read_questions(path: str | Path) -> list[str]:
    """The non-blank, non-comment lines of `path`."""
    lines = (line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines())
    questions = [line for line in lines if line and not line.startswith("#")]
    if not questions:
        raise ValueError(f"no questions in {path}")
    return questions


class AskFailed(Exception):
    """Why an Ask failed, short enough that locust's error table groups equal failures."""


class StreamMix:
    """Decides per Ask whether it streams, so that a share `share` of asks stream, evenly spread
    (share 0.5 alternates); `phase` in [0, 1) staggers users."""

    def __init__(self, share: float, phase: float) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"--ask-stream-share must be in [0, 1], got {share}")
        self.share, self.credit = share, phase

    def next_streams(self) -> bool:
        self.credit += self.share
        if self.credit >= 1.0:
            self.credit -= 1.0
            return True
        return False


class AskUser(User):
    """One client of the orchestrator: its own channel, its own shuffled question list."""

    host = DEFAULT_TARGET

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.retriever = RETRIEVER_CHOICES[options.ask_retriever]
        self.max_tokens = options.ask_max_tokens
        self.timeout = options.ask_timeout
        self.wait_range = (options.ask_wait_min, max(options.ask_wait_min, options.ask_wait_max))
        self.mix = StreamMix(options.ask_stream_share, random.random())
        self.questions = read_questions(options.ask_questions)
        random.shuffle(self.questions)
        self.asked = 0
        self.channel = keyed_channel(self.host.split("://", 1)[-1])   # tolerate --host http://...
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(self.channel)

    def on_stop(self) -> None:
        channel = getattr(self, "channel", None)
        if channel is not None:
            channel.close()      # cancels whatever call is still open on it
            self.channel = None

    def wait_time(self) -> float:
        return random.uniform(*self.wait_range)

    @task
    def ask(self) -> None:
        question = self.questions[self.asked % len(self.questions)]
        self.asked += 1
        self.run_ask(question, streaming=self.mix.next_streams())

    def run_ask(self, question: str, *, streaming: bool) -> None:
        mode = "stream" if streaming else "no-stream"
        request = orchestrator_pb2.AskRequest(question=question, retriever=self.retriever, no_stream=not streaming,
                                              max_tokens=self.max_tokens)
        context = {"question": question, "streaming": streaming}
        started = time.perf_counter()
        first_token_at = None
        done = None
        call = self.stub.Ask(request, timeout=self.timeout)
        try:
            for response in call:
                kind = response.event.WhichOneof("kind")
                if kind == "token" and first_token_at is None:
                    first_token_at = time.perf_counter()
                elif kind == "done":
                    done = response.event.done
        except grpc.RpcError as exc:
            failure = AskFailed(f"{exc.code().name}: {exc.details()}")
            self.report(f"Ask {mode} total", started, time.perf_counter(), context, exception=failure)
            return
        finally:
            call.cancel()        # no-op when the stream ended; frees the server's work when this user is stopped
        ended = time.perf_counter()
        if done is None:
            self.report(f"Ask {mode} total", started, ended, context,
                        exception=AskFailed("the stream ended without a done event"))
            return
        context["request_id"] = done.request_id
        if first_token_at is not None:
            self.report(f"Ask {mode} TTFT", started, first_token_at, context)
        self.fire(f"Ask {mode} TTFT after retrieval", max(0.0, done.ttft_from_retrieval_end_s) * 1000, 0, context)
        self.report(f"Ask {mode} total", started, ended, context, length=len(done.answer.encode()))

    def report(self, name: str, started: float, ended: float, context: dict, *, length: int = 0,
               exception: BaseException | None = None) -> None:
        self.fire(name, (ended - started) * 1000, length, context, exception)

    def fire(self, name: str, response_time_ms: float, length: int, context: dict,
             exception: BaseException | None = None) -> None:
        self.environment.events.request.fire(request_type="grpc", name=name, response_time=response_time_ms,
                                             response_length=length, exception=exception, context=dict(context))
