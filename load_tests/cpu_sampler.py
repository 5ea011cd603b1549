"""Which processes used the CPU while a step was slow: a per-process CPU sampler and its report.

    python -m load_tests.cpu_sampler record --out SAMPLES.jsonl [--interval 0.25]
    python -m load_tests.cpu_sampler report SAMPLES.jsonl STEP_LOG [--slow 0.5] [--top 6]

`record` writes one JSON line per interval until it is stopped (SIGTERM or Ctrl-C): the wall time
and every process's CPU seconds so far (user + system, psutil), plus a label per process the first
time it is seen (its name and the start of its command line).

`report` reads a step log (STREAMRAG_VLLM_STEP_LOG for our class inside vLLM, STREAMRAG_STEP_LOG
on the native engine: one JSON line per step with its wall time "t" and "scheduled": id -> tokens)
and finds the slow steps: a step followed by one that goes on with a request it scheduled while
work was left (the step was full, or something waited), where the gap to that next step exceeds
`--slow` seconds. An idle gap (a streaming request waiting for its next chunk) is not a slow step.
For each slow step it prints the CPU seconds each process used in that window, and the same for
the median normal full step, so a slow step can be told apart: the engine's own processes busy
for the whole window (work inside the engine), or another process taking the cores (contention).
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import statistics
import time
from pathlib import Path

import psutil


def _label(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline()[:4])
    except (psutil.Error, OSError):
        cmd = ""
    return f"{proc.name()} {cmd}"[:120]


def record(out: Path, interval: float) -> None:
    stop = False

    def _stop(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    seen: set[int] = set()
    with out.open("w", encoding="utf-8") as fh:
        while not stop:
            t = time.time()
            cpu, labels = {}, {}
            for proc in psutil.process_iter():
                try:
                    times = proc.cpu_times()
                    cpu[proc.pid] = round(times.user + times.system, 3)
                    if proc.pid not in seen:
                        labels[proc.pid] = _label(proc)
                        seen.add(proc.pid)
                except psutil.Error:
                    continue
            line = {"t": round(t, 3), "cpu": cpu}
            if labels:
                line["labels"] = labels
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            try:
                time.sleep(max(0.0, interval - (time.time() - t)))
            except KeyboardInterrupt:
                break


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def slow_steps(steps: list[dict], slow: float, budget: int) -> tuple[list[tuple[float, float, dict]], list[float]]:
    """(start, end, step) of each slow step, and the durations of the normal full steps."""
    found, normal = [], []
    for step, nxt in itertools.pairwise(steps):
        tokens = sum(step.get("scheduled", {}).values())
        goes_on = set(step.get("scheduled", {})) & set(nxt.get("scheduled", {}))
        if not goes_on or not (tokens >= budget * 0.97 or step.get("waiting", 0) > 0):
            continue
        gap = nxt["t"] - step["t"]
        if gap > slow:
            found.append((step["t"], nxt["t"], step))
        elif tokens >= budget * 0.97:
            normal.append(gap)
    return found, normal


def cpu_in(samples: list[dict], start: float, end: float) -> dict[int, float]:
    """CPU seconds per process between the samples that bracket [start, end]."""
    before = max((s for s in samples if s["t"] <= start), key=lambda s: s["t"], default=None)
    after = min((s for s in samples if s["t"] >= end), key=lambda s: s["t"], default=None)
    if before is None or after is None:
        return {}
    used = {}
    for pid, total in after["cpu"].items():
        delta = total - before["cpu"].get(pid, 0.0)
        if delta > 0.005:
            used[int(pid)] = delta
    return used


def report(samples_path: Path, step_log: Path, slow: float, budget: int, top: int) -> None:
    samples = _load(samples_path)
    labels = {int(pid): label for s in samples for pid, label in s.get("labels", {}).items()}
    found, normal = slow_steps(_load(step_log), slow, budget)
    t0 = min(s["t"] for s in samples)
    print(f"{step_log.name}: {len(found)} slow step(s) over {slow} s; normal full steps: {len(normal)}, "
          f"median {statistics.median(normal) if normal else float('nan'):.3f} s")

    def show(start: float, end: float) -> None:
        used = cpu_in(samples, start, end)
        window = max(end - start, 1e-9)
        for pid, sec in sorted(used.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {sec:6.2f} CPU-s ({sec / window:4.0%} of a core) pid {pid} {labels.get(pid, '?')}")
        print(f"    total {sum(used.values()):.2f} CPU-s in {window:.2f} s (sample bracket)")

    for start, end, step in found:
        print(f"  slow step at {start - t0:.2f} s: {end - start:.2f} s, {sum(step['scheduled'].values())} tokens, "
              f"running {step.get('running')}, waiting {step.get('waiting')}: {step['scheduled']}")
        show(start, end)
    # a contrast: the CPU of the whole run's busy time by process, per second of wall time
    if samples:
        print(f"  whole recording ({samples[-1]['t'] - t0:.0f} s), CPU-s by process:")
        show(samples[0]["t"], samples[-1]["t"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="sample every process's CPU time until stopped")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--interval", type=float, default=0.25)
    rep = sub.add_parser("report", help="CPU by process during each slow step of a step log")
    rep.add_argument("samples", type=Path)
    rep.add_argument("step_log", type=Path)
    rep.add_argument("--slow", type=float, default=0.5, help="a step longer than this is slow (seconds)")
    rep.add_argument("--budget", type=int, default=256, help="the token budget of a full step")
    rep.add_argument("--top", type=int, default=6)
    args = parser.parse_args(argv)
    if args.cmd == "record":
        if args.interval <= 0:
            parser.error("--interval must be positive")
        record(args.out, args.interval)
    else:
        for path in (args.samples, args.step_log):
            if not path.is_file():
                parser.error(f"{path}: no such file")
        report(args.samples, args.step_log, args.slow, args.budget, args.top)


if __name__ == "__main__":
    main()
