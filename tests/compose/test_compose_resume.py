"""Issue 42 on the compose stack (opt-in, like the rest of tests/compose): a streamed answer survives the
SIGKILL of the orchestrator serving it.

    bash scripts/test.sh tests/compose/test_compose_resume.py --run-compose

The stack is the suite's (`running_stack` of test_compose_stack.py: its images, an API key, TLS, the
gateway on a free port), with both replicas in float32 (docker-compose.fp32.yml here): greedy bf16
answers are not reproducible in the stack, so only fp32 lets the resumed answer be held equal to the
fault-free one. Two orchestrators (`orchestrator`, `orchestrator-1`) answer to the alias
`orchestrators`, which the gateway dials with round_robin and health checking; the gateway reads each
Ask through `servicekit.ask_resume.ResumableAsk`, which re-issues a broken Ask as a resume.

Which orchestrator serves an Ask is read from Redis: the one whose connection writes the Ask's
lifecycle (keyed by its request id) in `redis-cli monitor`. The kill is SIGKILL of that container's
main process from the host (`ComposeStack.crash`'s way): `docker kill` (Docker 20.10) counts as a
deliberate stop, which `restart: unless-stopped` leaves down.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import pytest

from tests.compose.test_compose_stack import DEPENDENCIES, QUESTION, RAG_MODEL, REPLICAS, ComposeStack, running_stack

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]   # the images build in the fixture

FP32 = "tests/compose/docker-compose.fp32.yml"
ORCHESTRATORS = ("orchestrator", "orchestrator-1")
KILL_AFTER = 5          # tokens the client has when its orchestrator is killed
RESUME_MAX_TOKENS = 64  # long enough that the kill lands inside the answer (the RESUMED event proves it did)
HANG_S = 600            # a guard against a hang, not a timing bound
# One line of `redis-cli monitor`: `<time> [<db> <client ip>:<port>] "<COMMAND>" "<arg>" ...`
MONITORED = re.compile(r'^\d+\.\d+ \[\d+ ([0-9.]+):\d+\] (.*)$')


@pytest.fixture(scope="module")
def stack(request):
    """The suite's stack with fp32 replicas."""
    with running_stack(request, overrides=(FP32,)) as s:
        yield s


class StreamedChat(threading.Thread):
    """A streamed, greedy RAG chat through the gateway with the official client, read on its own
    thread: the content deltas as they arrive (one per token with text), then the final chunk's
    `streamrag` extension and the usage chunk."""

    def __init__(self, stack: ComposeStack, max_tokens: int = RESUME_MAX_TOKENS) -> None:
        super().__init__(daemon=True)
        self.stack, self.max_tokens = stack, max_tokens
        self.pieces: list[str] = []
        self.request_id: str | None = None
        self.extension: dict = {}
        self.usage = None
        self.error: BaseException | None = None
        self.ended = False
        self.changed = threading.Condition()

    def run(self) -> None:
        try:
            with self.stack.client() as client:
                stream = client.chat.completions.create(
                    model=RAG_MODEL, stream=True, max_tokens=self.max_tokens, temperature=0,
                    stream_options={"include_usage": True}, messages=[{"role": "user", "content": QUESTION}],
                    extra_body={"retrieval": {"retriever": "anns"}})
                for chunk in stream:
                    with self.changed:
                        self.request_id = self.request_id or chunk.id
                        if (chunk.model_extra or {}).get("streamrag"):
                            self.extension = chunk.model_extra["streamrag"]
                        if chunk.usage is not None:
                            self.usage = chunk.usage
                        self.pieces.extend(c.delta.content for c in chunk.choices if c.delta.content)
                        self.changed.notify_all()
        except BaseException as exc:       # raised in the test by finish()
            self.error = exc
        finally:
            with self.changed:
                self.ended = True
                self.changed.notify_all()

    def wait_for_pieces(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.pieces) >= count or self.ended, HANG_S), "no tokens came"
            assert len(self.pieces) >= count, f"the answer ended after {len(self.pieces)} pieces: {self.error!r}"

    def finish(self) -> StreamedChat:
        self.join(HANG_S)
        assert not self.is_alive(), "the stream hung"
        if self.error is not None:
            raise AssertionError(f"the stream failed after {len(self.pieces)} pieces") from self.error
        assert self.usage is not None and self.extension, "no final chunk"
        return self

    @property
    def answer(self) -> str:
        return "".join(self.pieces)


class RedisMonitor:
    """`redis-cli monitor` in the Redis container: every command the lifecycle store gets, with the
    address of the client that sent it. The orchestrator serving an Ask writes its lifecycle
    (the request's hash and event stream, keyed by the request id) and, before its first token, its
    prompt; the other orchestrator writes nothing of it until it resumes it."""

    def __init__(self, stack: ComposeStack) -> None:
        self.proc = subprocess.Popen(["docker", "exec", stack.container("redis"), "redis-cli", "monitor"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.started = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        assert self.started.wait(120), f"redis-cli monitor did not start: {self.lines}"

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip() == "OK":
                self.started.set()
            self.lines.append(line)

    def writers(self, request_id: str) -> set[str]:
        """The addresses of the clients that sent a command naming `request_id` (its keys)."""
        return {m.group(1) for line in list(self.lines)
                if (m := MONITORED.match(line.strip())) and request_id in m.group(2)}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def orchestrator_addresses(stack: ComposeStack) -> dict[str, set[str]]:
    """Each orchestrator container's addresses on the compose network."""
    return {service: {n["IPAddress"] for n in (stack.inspect(service)["NetworkSettings"]["Networks"] or {}).values()
                      if n.get("IPAddress")} for service in ORCHESTRATORS}


def serving_orchestrator(monitor: RedisMonitor, request_id: str, ips: dict[str, set[str]]) -> str:
    """The orchestrator container whose connection wrote `request_id`'s lifecycle to Redis."""
    give_up = time.monotonic() + HANG_S
    while not (writers := monitor.writers(request_id)):
        assert time.monotonic() < give_up, f"nothing of {request_id} was written to Redis"
        time.sleep(0.05)
    serving = [service for service, own in ips.items() if own & writers]
    assert len(serving) == 1, f"{request_id} written by {writers}; the orchestrators are {ips}"
    return serving[0]


def test_a_streamed_answer_survives_the_sigkill_of_the_orchestrator_serving_it(stack):
    """A streamed chat through the gateway (the `openai` package); after its 5th token the orchestrator
    serving it is SIGKILLed. The gateway re-issues the Ask to the other orchestrator as a resume, and
    the client gets the whole answer, delta for delta the fault-free answer of the same stack (greedy,
    fp32 replicas), nothing repeated or lost; the record shows the survivor resumed it after the
    client's tokens. The killed container comes back (`restart: unless-stopped`), the stack is healthy,
    and the restarted orchestrator serves asks again. No timing is asserted (HANG_S only ends a hang)."""
    for replica in ("inference-0", "inference-1"):
        assert "STREAMRAG_INFERENCE_DTYPE=float32" in stack.inspect(replica)["Config"]["Env"]
    t0 = time.monotonic()
    reference = StreamedChat(stack)
    reference.start()
    reference.finish()
    assert len(reference.pieces) > KILL_AFTER + 1, f"the fault-free answer is too short: {reference.pieces}"

    before = {service: stack.inspect(service) for service in ORCHESTRATORS}     # no compose round trip later
    ips = orchestrator_addresses(stack)
    monitor = RedisMonitor(stack)
    try:
        chat = StreamedChat(stack)
        chat.start()
        chat.wait_for_pieces(KILL_AFTER)
        victim = serving_orchestrator(monitor, chat.request_id, ips)
        os.kill(before[victim]["State"]["Pid"], signal.SIGKILL)     # stack.crash(victim), its pid read before
        got_at_kill = len(chat.pieces)
        chat.finish()
    finally:
        monitor.close()
    survivor = next(s for s in ORCHESTRATORS if s != victim)
    stack.timed("answer resumed after its orchestrator's SIGKILL", t0)

    # the victim comes back by itself; then the stack is healthy
    stack.wait_restarted(victim, before[victim]["RestartCount"], seconds=HANG_S)
    stack.wait_healthy([*DEPENDENCIES, "orchestrator-1", "gateway"], HANG_S)

    # the kill crossed the answer: the survivor resumed it after the client's tokens
    record = stack.records(chat.request_id)[chat.request_id]
    resumed = [e.get("fields", {}) for e in record.get("events", []) if e["kind"] == "RESUMED"]
    assert len(resumed) == 1, record
    tokens_at_resume = int(resumed[0]["tokens"])
    print(f"\n{victim} killed with {got_at_kill} deltas at the client; {survivor} resumed after "
          f"{tokens_at_resume} of {reference.usage.completion_tokens} tokens", flush=True)
    assert KILL_AFTER <= tokens_at_resume < reference.usage.completion_tokens, (resumed, got_at_kill)
    assert f"{chat.request_id}: resuming after" in stack.logs(survivor)
    assert f"{chat.request_id}: resuming after" not in stack.logs(victim)

    # one answer, the fault-free one: no delta repeated, none missing
    if chat.pieces != reference.pieces:
        again = StreamedChat(stack)       # is the fault-free answer itself reproducible here?
        again.start()
        again.finish()
        pairs = list(zip(chat.pieces, reference.pieces, strict=False))
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
        events = [(e["kind"], e.get("fields")) for e in record["events"]]
        pytest.fail(f"the resumed answer differs from the fault-free one at delta {first} (resumed after "
                    f"{tokens_at_resume} tokens, {got_at_kill} deltas at the client at the kill; "
                    f"a second fault-free answer {'equals' if again.pieces == reference.pieces else 'differs from'} "
                    f"the first):\nresumed:    {chat.pieces}\nfault-free: {reference.pieces}\n"
                    f"again:      {again.pieces}\nrecord events: {events}")
    assert chat.usage.completion_tokens == reference.usage.completion_tokens
    assert record.get("state") == "REQUEST_STATE_FINISHED" and record["answer"] == reference.answer, record
    assert chat.extension["request_id"] == chat.request_id and chat.extension["sources"]
    assert [d["id"] for d in chat.extension["sources"]] == [d["id"] for d in reference.extension["sources"]]

    ips = orchestrator_addresses(stack)       # a restarted container may have a new address
    monitor = RedisMonitor(stack)
    try:
        give_up = time.monotonic() + HANG_S
        while True:             # round_robin over both: the restarted one gets asks again
            again = StreamedChat(stack, max_tokens=8)
            again.start()
            again.finish()
            assert again.answer and again.extension["replica"] in REPLICAS
            if serving_orchestrator(monitor, again.request_id, ips) == victim:
                break
            assert time.monotonic() < give_up, f"the restarted {victim} got no ask"
    finally:
        monitor.close()
    stack.timed("killed orchestrator back and serving", t0)
