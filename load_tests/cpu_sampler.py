"""Which processes used the CPU while a step was slow: a per-process CPU sampler and its report.

    streamrag bench cpu record --out SAMPLES.jsonl [--interval 0.25] [--threads-of TEXT]
    streamrag bench cpu report SAMPLES.jsonl[.gz] STEP_LOG [--slow 0.5] [--top 6]

`record` writes one JSON line per interval until it is stopped (SIGTERM or Ctrl-C): the wall time,
every process's CPU seconds so far (user + system, psutil) and major page faults so far (a page read
back from disk: /proc/PID/stat), each thread's CPU seconds in the processes whose command line holds
a `--threads-of` text, the machine's major faults (/proc/vmstat) and the CPU time the hypervisor gave
to others (steal, /proc/stat), plus a label per process and thread the first time it is seen.

`report` reads a step log (STREAMRAG_VLLM_STEP_LOG for our class inside vLLM, STREAMRAG_STEP_LOG
on the native engine: one JSON line per step with its wall time "t" and "scheduled": id -> tokens)
and finds the slow steps: a step followed by one that goes on with a request it scheduled while
work was left (the step was full, or something waited), where the gap to that next step exceeds
`--slow` seconds. An idle gap (a streaming request waiting for its next chunk) is not a slow step.
For each slow step it prints the CPU seconds and major page faults of each process in that window,
so a slow step can be told apart: another process taking the cores (contention), the hypervisor
taking them (steal), the engine's own processes waiting on pages read back from disk (faults), or
busy with work of their own.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import psutil

from load_tests.runner import positive_float


def _label(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline()[:4])
    except (psutil.Error, OSError):
        cmd = ""
    return f"{proc.name()} {cmd}"[:120]


def _majflt(pid: int) -> int:
    """Major page faults of a process so far (field 12 of /proc/PID/stat), 0 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[9])


def _machine_majflt() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("pgmajfault "):
            return int(line.split()[1])
    return 0


def _machine_steal_s() -> float:
    """CPU seconds the hypervisor gave to others while this machine's CPUs wanted to run (/proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def _thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def record(out: Path, interval: float, threads_of: tuple[str, ...] = ()) -> None:
    stop = False

    def _stop(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    seen: set[int] = set()
    traced: dict[int, bool] = {}   # pid -> whether its threads are sampled too
    seen_threads: set[str] = set()
    with out.open("w", encoding="utf-8") as fh:
        while not stop:
            t = time.time()
            cpu, faults, labels, thread_cpu, thread_labels = {}, {}, {}, {}, {}
            for proc in psutil.process_iter():
                try:
                    times = proc.cpu_times()
                    cpu[proc.pid] = round(times.user + times.system, 3)
                    if majflt := _majflt(proc.pid):
                        faults[proc.pid] = majflt
                    if proc.pid not in seen:
                        labels[proc.pid] = _label(proc)
                        traced[proc.pid] = any(pattern in labels[proc.pid] for pattern in threads_of)
                        seen.add(proc.pid)
                    if traced.get(proc.pid):
                        for thread in proc.threads():
                            key = f"{proc.pid}/{thread.id}"
                            thread_cpu[key] = round(thread.user_time + thread.system_time, 3)
                            if key not in seen_threads:
                                thread_labels[key] = _thread_name(proc.pid, thread.id)
                                seen_threads.add(key)
                except psutil.Error:
                    continue
            line = {"t": round(t, 3), "cpu": cpu, "majflt": faults, "machine_majflt": _machine_majflt(),
                    "machine_steal_s": _machine_steal_s()}
            if labels:
                line["labels"] = labels
            if thread_cpu:
                line["threads"] = thread_cpu
            if thread_labels:
                line["thread_labels"] = thread_labels
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            time.sleep(max(0.0, interval - (time.time() - t)))


def _load(path: Path) -> list[dict]:
    """JSON lines from a file, gzip-compressed if its name ends in .gz (how samples are kept in docs/)."""
    text = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


SlowStep = tuple[float, float, dict, dict]


def slow_steps(steps: list[dict], slow: float, budget: int) -> tuple[list[SlowStep], list[float]]:
    """(start, end, step, next step) of each slow step, and the durations of the normal full steps."""
    found, normal = [], []
    for step, nxt in itertools.pairwise(steps):
        tokens = sum(step.get("scheduled", {}).values())
        goes_on = set(step.get("scheduled", {})) & set(nxt.get("scheduled", {}))
        if not goes_on or not (tokens >= budget * 0.97 or step.get("waiting", 0) > 0):
            continue
        gap = nxt["t"] - step["t"]
        if gap > slow:
            found.append((step["t"], nxt["t"], step, nxt))
        elif tokens >= budget * 0.97:
            normal.append(gap)
    return found, normal


def _bracket(samples: list[dict], start: float, end: float) -> tuple[dict | None, dict | None]:
    before = max((s for s in samples if s["t"] <= start), key=lambda s: s["t"], default=None)
    after = min((s for s in samples if s["t"] >= end), key=lambda s: s["t"], default=None)
    return before, after


def cpu_in(samples: list[dict], start: float, end: float, field: str = "cpu") -> dict[int | str, float]:
    """CPU seconds per process (field="majflt": major faults; field="threads": CPU seconds per
    "pid/tid" key) between the samples that bracket [start, end]."""
    before, after = _bracket(samples, start, end)
    if before is None or after is None:
        return {}
    used = {}
    for pid, total in after.get(field, {}).items():
        delta = total - before.get(field, {}).get(pid, 0.0)
        if delta > 0.005:
            used[pid if field == "threads" else int(pid)] = delta
    return used


def _whole(samples: list[dict], field: str) -> dict[int, float]:
    """Per process over the recording: its last value less its first (processes come and go)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for s in samples:
        for pid, value in s.get(field, {}).items():
            first.setdefault(pid, value)
            last[pid] = value
    return {int(pid): last[pid] - first[pid] for pid in last if last[pid] - first[pid] > 0.005}


def report(samples_path: Path, step_log: Path, slow: float, budget: int, top: int) -> None:
    samples = _load(samples_path)
    if not samples:
        raise SystemExit(f"error: {samples_path}: no samples (was the recording stopped at once?)")
    labels = {int(pid): label for s in samples for pid, label in s.get("labels", {}).items()}
    thread_labels = {key: label for s in samples for key, label in s.get("thread_labels", {}).items()}
    found, normal = slow_steps(_load(step_log), slow, budget)
    t0 = min(s["t"] for s in samples)
    print(f"{step_log.name}: {len(found)} slow step(s) over {slow} s; normal full steps: {len(normal)}, "
          f"median {statistics.median(normal) if normal else float('nan'):.3f} s")

    def show(used: dict[int, float], faults: dict[int, float], window: float, machine_faults: int,
             steal: float) -> None:
        for pid, sec in sorted(used.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {sec:6.2f} CPU-s ({sec / window:4.0%} of a core), {faults.get(pid, 0):5.0f} major faults,"
                  f" pid {pid} {labels.get(pid, '?')}")
        print(f"    total {sum(used.values()):.2f} CPU-s in {window:.2f} s; "
              f"major faults on the machine: {machine_faults}; stolen by the hypervisor: {steal:.2f} CPU-s")

    for start, end, step, nxt in found:
        print(f"  slow step at {start - t0:.2f} s: {end - start:.2f} s, {sum(step['scheduled'].values())} tokens, "
              f"running {step.get('running')}, waiting {step.get('waiting')}: {step['scheduled']}")
        if "gc_ms" in nxt:  # the step log's own clocks (since session 15): where the engine process's time went
            print(f"    in the engine process: schedule {step.get('schedule_ms', '?')} ms, update_from_output "
                  f"{nxt.get('update_ms', '?')} ms, garbage collector {nxt['gc_ms']} ms "
                  f"({nxt.get('gc_gen2', 0)} full collections)")
        before, after = _bracket(samples, start, end)
        if before is None or after is None:
            print("    (outside the recording)")
            continue
        show(cpu_in(samples, start, end), cpu_in(samples, start, end, "majflt"), after["t"] - before["t"],
             after.get("machine_majflt", 0) - before.get("machine_majflt", 0),
             after.get("machine_steal_s", 0) - before.get("machine_steal_s", 0))
        threads = sorted(cpu_in(samples, start, end, "threads").items(), key=lambda kv: -kv[1])[:top]
        if threads:
            print("    by thread (pid/tid name CPU-s): "
                  + ", ".join(f"{key} {thread_labels.get(key, '?')} {sec:.2f}" for key, sec in threads))
        print(f"    (sample bracket {before['t'] - t0:.2f}-{after['t'] - t0:.2f} s)")
    # the contrast: the whole recording
    print(f"  whole recording ({samples[-1]['t'] - t0:.0f} s):")
    show(_whole(samples, "cpu"), _whole(samples, "majflt"), samples[-1]["t"] - t0,
         samples[-1].get("machine_majflt", 0) - samples[0].get("machine_majflt", 0),
         samples[-1].get("machine_steal_s", 0) - samples[0].get("machine_steal_s", 0))


def add_bench_cpu_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="sample every process's CPU time until stopped", allow_abbrev=False)
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--interval", type=positive_float, default=0.25)
    rec.add_argument("--threads-of", action="append", default=[], metavar="TEXT",
                     help="also sample the threads of processes whose command line holds TEXT (repeatable)")
    rep = sub.add_parser("report", help="CPU by process during each slow step of a step log",
                         allow_abbrev=False)
    rep.add_argument("samples", type=Path)
    rep.add_argument("step_log", type=Path)
    rep.add_argument("--slow", type=float, default=0.5, help="a step longer than this is slow (seconds)")
    rep.add_argument("--budget", type=int, default=256, help="the token budget of a full step")
    rep.add_argument("--top", type=int, default=6)


def run_bench_cpu(args: argparse.Namespace) -> int:
    if args.cmd == "record":
        record(args.out, args.interval, tuple(args.threads_of))
        return 0
    missing = [str(path) for path in (args.samples, args.step_log) if not path.is_file()]
    if missing:
        print(f"error: {', '.join(missing)}: no such file", file=sys.stderr)
        return 2
    report(args.samples, args.step_log, args.slow, args.budget, args.top)
    return 0

