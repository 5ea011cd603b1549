"""`streamrag up | status | down`: the whole stack as processes, through the console script.

The end-to-end tests run the real services (model, DiskANN index, crawler, Redis) on the tiny
corpus, on ports shifted by a `--port-offset` that puts every port outside the kernel's
ephemeral range (so they never collide with a real stack or another test's free port), with
a temporary run directory. The plan and health-check tests below them need no services.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from orchestrator import stack
from orchestrator.cli import build_parser
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.config import DEFAULT_PORTS, metrics_port_for

STREAMRAG = Path(sys.executable).with_name("streamrag")
SERVICES = {"redis", "corpus", "anns", "crawler", "inference-0", "orchestrator"}


def stack_commands_wired() -> bool:
    parser = build_parser()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            for command in ("up", "status", "down"):
                parser.parse_args([command])
    except SystemExit:
        return False
    return True


needs_wiring = pytest.mark.skipif(not stack_commands_wired(),
                                  reason="`streamrag up/status/down` are not wired in orchestrator/cli.py yet")
def streamrag(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(STREAMRAG), *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))


def stack_ports(offset: int, replicas: int = 1) -> list[int]:
    ports = [port + offset for name, port in DEFAULT_PORTS.items() if name != "inference"]
    ports += [DEFAULT_PORTS["inference"] + offset + i for i in range(replicas)]
    ports += [metrics_port_for(name) + offset for name in ("orchestrator", "anns", "crawler")]
    return ports + [metrics_port_for("inference", i) + offset for i in range(replicas)]


def free_offset() -> int:
    """An offset whose gRPC ports land above the ephemeral range (61000+) and are all free."""
    for offset in random.sample(range(10_949, 15_400), 200):
        if not any(stack.port_in_use(port) for port in stack_ports(offset)):
            return offset
    raise RuntimeError("no free port offset")


def processes_in(run_dir: Path) -> list[int]:
    """Live processes whose working directory is `run_dir` (every service `up` starts runs there)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")) == run_dir and stack.process_start_ticks(int(proc.name)):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.fixture
def run_dir(tmp_path: Path):
    """A run directory; whatever a failed test left running there is stopped afterwards."""
    directory = (tmp_path / "run").resolve()
    yield directory
    for pid in processes_in(directory):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory) -> Path:
    from tests.retriever import build_tiny_index

    return build_tiny_index(tmp_path_factory.mktemp("tiny"))


@needs_wiring
def test_up_status_ask_down(tiny_corpus: Path, tmp_path: Path, run_dir: Path):
    offset, index = free_offset(), tmp_path / "index"
    up_args = ["up", "--run-dir", str(run_dir), "--port-offset", str(offset), "--replicas", "1",
               "--corpus-root", str(tiny_corpus), "--index", str(index), "--timeout", "240"]
    up = streamrag(*up_args)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "index" in up.stdout and (index / "manifest.json").is_file(), "up should have built the missing index"

    state = json.loads((run_dir / "state.json").read_text())
    assert {s["name"] for s in state["services"]} == SERVICES
    pids = {s["name"]: s["pid"] for s in state["services"]}
    for name, pid in pids.items():
        assert (run_dir / f"{name}.pid").read_text().strip() == str(pid)
        assert (run_dir / "logs" / f"{name}.log").is_file()

    status = streamrag("status", "--run-dir", str(run_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    rows = {line.split()[0]: line for line in status.stdout.splitlines()[1:-1]}
    assert set(rows) == SERVICES
    assert all(" healthy " in row for row in rows.values()), status.stdout
    assert "KV free/total blocks" in rows["inference-0"] and "anns" in rows["anns"]

    again = streamrag(*up_args)
    assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr

    orchestrator = f"127.0.0.1:{DEFAULT_PORTS['orchestrator'] + offset}"
    with grpc.insecure_channel(orchestrator) as channel:
        request = orchestrator_pb2.AskRequest(question="How do I close a file?",
                                              retriever=orchestrator_pb2.RETRIEVER_CHOICE_ANNS, max_tokens=8)
        events = [r.event for r in orchestrator_pb2_grpc.OrchestratorStub(channel).Ask(request, timeout=120)]
    assert events[-1].WhichOneof("kind") == "done" and events[-1].done.answer

    os.kill(pids["crawler"], signal.SIGTERM)           # one service goes away: status and up say so
    deadline = time.monotonic() + 30
    while stack.process_start_ticks(pids["crawler"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    status = streamrag("status", "--run-dir", str(run_dir))
    assert status.returncode == 1 and "down: crawler" in status.stdout, status.stdout
    partly = streamrag(*up_args)
    assert partly.returncode == 1 and "partly down (crawler" in partly.stderr, partly.stdout + partly.stderr

    down = streamrag("down", "--run-dir", str(run_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not [name for name, pid in pids.items() if stack.process_start_ticks(pid)], "a service outlived down"
    assert processes_in(run_dir) == []
    assert not list(run_dir.glob("*.pid")) and not (run_dir / "state.json").exists()
    assert streamrag("status", "--run-dir", str(run_dir)).returncode == 1


@needs_wiring
def test_a_service_that_fails_is_named_with_its_log_and_nothing_stays_up(tiny_index: Path, tmp_path: Path,
                                                                          run_dir: Path):
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    up = streamrag("up", "--run-dir", str(run_dir), "--port-offset", str(free_offset()),
                   "--corpus-root", str(tiny_index.parent / "site"), "--index", str(tiny_index),
                   "--model", str(not_a_model), "--timeout", "120")
    assert up.returncode == 1
    assert "inference-0 failed" in up.stderr and "not a model directory" in up.stderr, up.stderr
    assert "inference-0.log" in up.stderr
    assert processes_in(run_dir) == []
    assert not (run_dir / "state.json").exists()


# ---------------------------------------------------------------- no services needed

def up_args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    stack.add_up_args(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_every_planned_command_is_one_the_cli_accepts():
    services = stack.plan_stack(up_args(replicas=3, port_offset=7), Path("/tmp/index"), redis_port=6386)
    parser = build_parser()
    for service in services:
        if service.kind == "redis":
            continue
        assert service.argv[:3] == [sys.executable, "-m", "orchestrator.cli"]
        args = parser.parse_args(service.argv[3:])
        assert args.host == "127.0.0.1"
        assert args.port == int(service.target.rsplit(":", 1)[1].split("/")[0])
    orchestrator = parser.parse_args(services[-1].argv[3:])
    assert orchestrator.inference == ["127.0.0.1:50059", "127.0.0.1:50060", "127.0.0.1:50061"]
    assert orchestrator.redis == "redis://127.0.0.1:6386/0"


def test_the_plan_binds_each_port_once_even_with_the_most_replicas():
    services = stack.plan_stack(up_args(replicas=stack.MAX_REPLICAS), Path("/tmp/index"), redis_port=6379)
    ports = [port for s in services for port in s.ports]
    assert len(ports) == len(set(ports))
    assert {s.name for s in services} >= {"redis", "corpus", "anns", "crawler", "orchestrator", "inference-8"}


def test_an_external_redis_is_neither_started_nor_stopped():
    services = stack.plan_stack(up_args(redis="redis://10.0.0.5:6379/2"), Path("/tmp/index"), redis_port=6379)
    redis = services[0]
    assert redis.argv is None and redis.ports == []
    assert stack.stop_in_order(services, timeout_s=0.1) == []
    assert "--redis" in services[-1].argv and "redis://10.0.0.5:6379/2" in services[-1].argv


def test_health_checks_say_why_a_service_is_down():
    port = stack.free_port()
    assert stack.check_health("grpc", f"127.0.0.1:{port}", 0.5) is not None
    assert stack.check_health("http", f"http://127.0.0.1:{port}/index.html", 0.5) is not None
    assert stack.check_health("redis", f"redis://127.0.0.1:{port}/0", 0.5) is not None
    probe = subprocess.run([sys.executable, "-m", "orchestrator.stack", "probe", "grpc", f"127.0.0.1:{port}",
                            "--timeout", "0.5"], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 1 and f"127.0.0.1:{port}" in probe.stderr


def test_redis_health_is_a_ping(redis_server):
    assert stack.check_health("redis", redis_server.url) is None


def test_a_reused_pid_is_not_the_process_up_started():
    me = stack.Service("x", "corpus", "", ["x"], pid=os.getpid(), started=stack.process_start_ticks(os.getpid()))
    assert stack.is_running(me)
    me.started = (me.started or 0) - 1
    assert not stack.is_running(me)


def test_up_refuses_an_unknown_latency_profile_before_starting_anything(tmp_path: Path, capsys):
    assert stack.run_up(up_args(latency="fast", run_dir=tmp_path / "run")) == 2
    assert "--latency" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_status_and_down_with_no_stack(tmp_path: Path, capsys):
    args = argparse.Namespace(run_dir=tmp_path, timeout=1.0)
    assert stack.run_status(args) == 1
    assert stack.run_down(args) == 0
    assert "no stack is up" in capsys.readouterr().out


def test_a_dead_stack_is_forgotten_and_a_half_dead_one_refused(tmp_path: Path, capsys):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = stack.Service("corpus", "corpus", "http://x", ["x"], pid=child.pid,
                              started=stack.process_start_ticks(child.pid))
        dead = stack.Service("anns", "retriever", "127.0.0.1:1", ["x"], pid=child.pid, started=-1)
        orchestrator = stack.Service("orchestrator", "orchestrator", "127.0.0.1:2", ["x"], pid=child.pid, started=-1)
        options = {"replicas": 1, "policy": "fcfs"}
        stack.write_state(tmp_path, options, [alive, dead, orchestrator])
        assert stack.already_up(tmp_path) == 1
        assert "partly down" in capsys.readouterr().err
        stack.write_state(tmp_path, options, [dead, orchestrator])
        assert stack.already_up(tmp_path) is None
        assert stack.read_stack(tmp_path) is None
    finally:
        child.kill()
        child.wait()


def test_down_escalates_to_sigkill_for_a_process_that_ignores_sigterm():
    ignore_sigterm = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)"
    child = subprocess.Popen([sys.executable, "-c", ignore_sigterm + "; time.sleep(60)"], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        service = stack.Service("stubborn", "corpus", "", ["x"], pid=child.pid,
                                started=stack.process_start_ticks(child.pid))
        t0 = time.monotonic()
        killed = stack.stop_services([service], timeout_s=0.5)
        assert killed == ["stubborn"] and time.monotonic() - t0 < 5
        assert child.wait(timeout=5) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
