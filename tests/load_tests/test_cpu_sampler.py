"""`streamrag bench cpu`: slow steps are told from idle gaps, and CPU is attributed per window."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from load_tests.cpu_sampler import cpu_in, slow_steps


def _step(t, scheduled, waiting=0):
    return {"t": t, "scheduled": scheduled, "waiting": waiting}


def test_a_slow_full_step_is_found_and_an_idle_gap_is_not():
    steps = [
        _step(0.0, {"a": 256}),
        _step(0.12, {"a": 256}),   # normal full step
        _step(1.20, {"a": 40}),    # the step before took 1.08 s with work left: slow
        _step(3.00, {"a": 10}),    # 1.8 s gap after a 40-token turn: idle (waiting for a chunk)
        _step(3.10, {"b": 100}, waiting=1),
        _step(3.90, {"b": 50}),    # waiting work and the same request goes on: slow
    ]
    found, normal = slow_steps(steps, slow=0.5, budget=256)
    assert [(round(a, 2), round(b, 2)) for a, b, _, _ in found] == [(0.12, 1.2), (3.1, 3.9)]
    assert [round(g, 2) for g in normal] == [0.12]


def test_cpu_is_taken_between_the_bracketing_samples():
    samples = [
        {"t": 0.0, "cpu": {"1": 1.0, "2": 5.0}},
        {"t": 0.5, "cpu": {"1": 1.4, "2": 5.0}},
        {"t": 1.0, "cpu": {"1": 1.9, "2": 5.3, "3": 0.2}},
    ]
    assert cpu_in(samples, 0.1, 0.9) == pytest.approx({1: 0.9, 2: 0.3, 3: 0.2})
    assert cpu_in(samples, 0.5, 0.5) == {}
    assert cpu_in(samples, 2.0, 3.0) == {}


def test_record_writes_samples_until_terminated(tmp_path):
    out = tmp_path / "samples.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "streamrag.cli", "bench", "cpu", "record", "--out", str(out),
                             "--interval", "0.05"])
    deadline = time.time() + 60
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) >= 2
    assert str(proc.pid) in lines[0]["cpu"]
    assert "streamrag.cli bench" in lines[0]["labels"][str(proc.pid)]
    assert str(os.getpid()) in lines[0]["cpu"]


def test_threads_are_sampled_for_the_named_processes(tmp_path):
    out = tmp_path / "samples.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "streamrag.cli", "bench", "cpu", "record", "--out", str(out),
                             "--interval", "0.05", "--threads-of", "streamrag.cli"])
    deadline = time.time() + 60
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert f"{proc.pid}/{proc.pid}" in first["threads"]            # its main thread
    assert first["thread_labels"][f"{proc.pid}/{proc.pid}"]


def test_a_compressed_recording_reads_like_the_plain_one(tmp_path):
    import gzip

    from load_tests.cpu_sampler import _load

    lines = [{"t": 0.0, "cpu": {"1": 1.0}}, {"t": 1.0, "cpu": {"1": 2.0}}]
    text = "\n".join(json.dumps(line) for line in lines) + "\n"
    (tmp_path / "a.jsonl").write_text(text)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert _load(tmp_path / "a.jsonl") == _load(tmp_path / "a.jsonl.gz") == lines


def test_an_empty_recording_is_refused_by_name(tmp_path):
    (tmp_path / "cpu.jsonl").write_text("")
    (tmp_path / "steps.jsonl").write_text("")
    result = subprocess.run([sys.executable, "-m", "streamrag.cli", "bench", "cpu", "report",
                             str(tmp_path / "cpu.jsonl"), str(tmp_path / "steps.jsonl")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "no samples" in result.stderr and "Traceback" not in result.stderr
