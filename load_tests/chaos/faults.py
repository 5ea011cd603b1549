"""The fault schedule and the thread that inflicts it.

A fault is one action on one service at a time: `kill` (SIGKILL; the supervisor or compose starts
it again) or `stop` (SIGSTOP for `stop_s` seconds, then SIGCONT). The default schedule takes the
targets in turn (an inference replica, each retriever, the orchestrator, Redis), killing each on
the first round and freezing each on the next, one fault every `every_s` seconds, the first half a
period in. `--faults kill:inference-0,stop:anns` names the faults instead.

Each fault's window runs from the signal until the service is back: a new incarnation (a kill)
or SIGCONT sent (a stop), and answering its health check. An ask that fails while overlapping a
window is that fault's; any other failure is outside every window.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

ACTIONS = ("kill", "stop")
DEFAULT_TARGETS = ("inference-0", "anns", "crawler", "orchestrator", "redis")


@dataclass(frozen=True)
class FaultPlan:
    action: str        # "kill" or "stop"
    target: str        # a service name
    at_s: float        # seconds after the soak starts


def parse_faults(text: str) -> list[tuple[str, str]]:
    """"kill:inference-0,stop:anns" -> [("kill", "inference-0"), ("stop", "anns")]."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        action, _, target = item.partition(":")
        if action not in ACTIONS or not target:
            raise ValueError(f"a fault is ACTION:SERVICE with ACTION one of {', '.join(ACTIONS)}, got {item!r}")
        faults.append((action, target))
    if not faults:
        raise ValueError("no faults named")
    return faults


def schedule(duration_s: float, every_s: float, faults: list[tuple[str, str]] | None = None,
             targets: tuple[str, ...] = DEFAULT_TARGETS) -> list[FaultPlan]:
    """Faults at every_s/2, every_s*3/2, ... before `duration_s`: the named ones in order (cycled), or the
    default targets in turn, killed on the first round and stopped on the next."""
    times = []
    at = every_s / 2
    while at < duration_s:
        times.append(at)
        at += every_s
    if faults is None:
        faults = [(ACTIONS[(i // len(targets)) % 2], targets[i % len(targets)]) for i in range(len(times))]
    return [FaultPlan(*faults[i % len(faults)], at_s=t) for i, t in enumerate(times)]


@dataclass
class FaultRecord:
    plan: FaultPlan
    started: float | None = None       # monotonic: the signal
    hit: str = ""                      # what the signal reached ("pid 123")
    resumed: float | None = None       # monotonic: SIGCONT (a stop)
    healthy: float | None = None       # monotonic: back and answering its health check
    error: str = ""                    # why it could not be inflicted or did not come back
    probe_ok: float | None = None      # monotonic: start of the first probe ask answered with the service's part
    probe_answered: float | None = None   # monotonic: that ask's answer

    @property
    def window(self) -> tuple[float, float | None]:
        return self.started or 0.0, self.healthy


@dataclass
class FaultInjector:
    """Runs a schedule against a stack (stacks.LocalStack or ComposeStack) in a thread."""

    stack: object
    plans: list[FaultPlan]
    stop_s: float = 10.0
    recover_timeout_s: float = 300.0
    poll_s: float = 0.25
    say: object = print
    on_signal: object = None           # called with the FaultRecord right after each signal
    records: list[FaultRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.quit = threading.Event()
        self.thread = threading.Thread(target=self._run, name="chaos-faults", daemon=True)
        self.frozen: str | None = None

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.thread.start()

    def join(self) -> None:
        """Wait for the whole schedule: a fault runs late when the one before took long to recover."""
        self.thread.join()

    def abort(self) -> None:
        """No more faults; wait for the one in progress to end (its service thawed and back)."""
        self.quit.set()
        self.thread.join()

    def _run(self) -> None:
        try:
            for plan in self.plans:
                if self.quit.wait(max(0.0, self.t0 + plan.at_s - time.monotonic())):
                    return
                record = FaultRecord(plan)
                self.records.append(record)
                self._inflict(record)
        finally:
            if self.frozen is not None:         # never leave a service frozen
                self.stack.signal(self.frozen, "cont")

    def _inflict(self, record: FaultRecord) -> None:
        plan, stack = record.plan, self.stack
        try:
            before = stack.incarnation(plan.target)
            record.started = time.monotonic()
            record.hit = stack.signal(plan.target, plan.action)
        except Exception as exc:                # not running, unknown service: say so, go on
            record.error = f"could not {plan.action} {plan.target}: {exc}"
            self.say(record.error)
            return
        self.say(f"{plan.action} {plan.target} ({record.hit}) at {record.started - self.t0:.1f} s")
        if self.on_signal is not None:
            self.on_signal(record)
        if plan.action == "stop":
            self.frozen = plan.target
            time.sleep(self.stop_s)
            stack.signal(plan.target, "cont")
            self.frozen = None
            record.resumed = time.monotonic()
        deadline = record.started + self.recover_timeout_s
        while time.monotonic() < deadline:
            now = stack.incarnation(plan.target)
            if now is not None and (plan.action == "stop" or now != before) and stack.is_up(plan.target):
                record.healthy = time.monotonic()
                self.say(f"{plan.target} healthy again {record.healthy - record.started:.1f} s after the "
                         f"{plan.action}")
                return
            time.sleep(self.poll_s)
        record.error = f"{plan.target} not healthy {self.recover_timeout_s:.0f} s after the {plan.action}"
        self.say(record.error)
