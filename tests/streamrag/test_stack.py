"""`streamrag up | status | down`: the whole stack as processes, through the console script.

The end-to-end tests run the real services (model, DiskANN index, crawler, Redis) on the tiny
corpus, every one on a port the kernel picks (`up --free-ports`), with a temporary run
directory: one goes through up, status, an Ask, `up` on a partly-down stack and down; the
other kills services with SIGKILL and checks that the supervisor starts them again and the
orchestrator uses them again. The plan, supervisor and health-check tests below them need no
services.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit import health
from servicekit.auth import keyed_channel
from streamrag.cli import build_parser
from streamrag.stack import commands, plan, processes, state, supervisor
from tests.support.stack import STREAMRAG, processes_in, streamrag

SERVICES = {"redis", "corpus", "anns", "crawler", "inference-0", "orchestrator", "gateway"}


def orchestrator_of(services):
    return next(s for s in services if s.name == "orchestrator")


def up_tiny_stack(run_dir: Path, tiny_index: Path) -> list[str]:
    """`streamrag up` on the tiny corpus, every port a free one; returns the up arguments."""
    up_args = ["up", "--run-dir", str(run_dir), "--free-ports", "--replicas", "1",
               "--corpus-root", str(tiny_index.parent / "site"), "--index", str(tiny_index), "--timeout", "240"]
    up = streamrag(*up_args)
    assert up.returncode == 0, up.stdout + up.stderr
    return up_args


def services_of(run_dir: Path) -> dict[str, plan.Service]:
    return {s.name: s for s in state.read_state(run_dir).services}


def status_rows(run_dir: Path) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    status = streamrag("status", "--run-dir", str(run_dir))
    lines = status.stdout.splitlines()
    return status, {line.split()[0]: line for line in lines[1:] if line.split()[0] in SERVICES}


def stack_key(run_dir: Path) -> str:
    """The key `up` made for the stack (the CLI finds it by itself; a raw client reads it)."""
    return (run_dir / "api-key").read_text().strip()


def ask(orchestrator: str, key: str, question: str = "How do I close a file?") -> orchestrator_pb2.AskDone:
    with keyed_channel(orchestrator, key=key) as channel:
        request = orchestrator_pb2.AskRequest(question=question, retriever=orchestrator_pb2.RETRIEVER_CHOICE_ANNS,
                                              max_tokens=8)
        events = [r.event for r in orchestrator_pb2_grpc.OrchestratorStub(channel).Ask(request, timeout=120)]
    assert events[-1].WhichOneof("kind") == "done" and events[-1].done.answer, events[-1]
    return events[-1].done


def get_request(orchestrator: str, key: str, request_id: str) -> orchestrator_pb2.RequestRecord:
    with keyed_channel(orchestrator, key=key) as channel:
        return orchestrator_pb2_grpc.OrchestratorStub(channel).GetRequest(
            orchestrator_pb2.GetRequestRequest(request_id=request_id), timeout=30).record


def wait_gone(pid: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while processes.process_start_ticks(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.slow   # a whole stack (`bash scripts/test.sh --run-slow`)
def test_up_status_ask_up_on_a_partly_down_stack_and_down(tiny_index: Path, tmp_path: Path, run_dir: Path):
    index = tmp_path / "index"
    up_args = ["up", "--run-dir", str(run_dir), "--free-ports", "--replicas", "1",
               "--corpus-root", str(tiny_index.parent / "site"), "--index", str(index), "--timeout", "240"]
    up = streamrag(*up_args)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "index" in up.stdout and (index / "manifest.json").is_file(), "up should have built the missing index"

    recorded = json.loads((run_dir / "state.json").read_text())
    assert {s["name"] for s in recorded["services"]} == SERVICES
    pids = {s["name"]: s["pid"] for s in recorded["services"]}
    for name, pid in pids.items():
        assert (run_dir / f"{name}.pid").read_text().strip() == str(pid)
        assert (run_dir / "logs" / f"{name}.log").is_file()
    watcher = recorded["supervisor"]
    assert watcher and processes.is_running(plan.Service(**watcher))
    ports = [port for s in recorded["services"] for port in s["ports"]]
    assert len(ports) == len(set(ports)) == 11 and not set(ports) & {50051, 50052, 50061, 50062, 8765, 8000}

    status, rows = status_rows(run_dir)
    assert status.returncode == 0, status.stdout + status.stderr
    assert set(rows) == SERVICES
    assert all(" healthy " in row for row in rows.values()), status.stdout
    assert "KV free/total blocks" in rows["inference-0"] and "anns" in rows["anns"]
    assert f"supervisor: pid {watcher['pid']}" in status.stdout

    again = streamrag(*up_args)
    assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr

    orchestrator = services_of(run_dir)["orchestrator"].target
    done = ask(orchestrator, stack_key(run_dir))
    assert done.replica == services_of(run_dir)["inference-0"].target

    os.kill(watcher["pid"], signal.SIGKILL)            # nothing watches the stack now
    os.kill(pids["crawler"], signal.SIGKILL)           # and one service goes away: status says so
    wait_gone(pids["crawler"])
    status, rows = status_rows(run_dir)
    assert status.returncode == 1 and "down: crawler" in status.stdout, status.stdout
    assert "supervisor: not running" in status.stdout
    partly = streamrag(*up_args)                        # up starts only what is down, and a supervisor
    assert partly.returncode == 0, partly.stdout + partly.stderr
    assert "partly down (crawler not running)" in partly.stdout, partly.stdout
    now = services_of(run_dir)
    assert now["crawler"].pid != pids["crawler"] and processes.is_running(now["crawler"])
    assert {name: s.pid for name, s in now.items() if name != "crawler"} == \
        {name: pid for name, pid in pids.items() if name != "crawler"}
    assert streamrag("status", "--run-dir", str(run_dir)).returncode == 0
    new_watcher = state.read_state(run_dir).supervisor
    assert new_watcher.pid != watcher["pid"] and processes.is_running(new_watcher)

    down = streamrag("down", "--run-dir", str(run_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    live = [s.name for s in [*now.values(), new_watcher] if processes.is_running(s)]
    assert not live, f"{live} outlived down"
    assert processes_in(run_dir) == []
    assert not list(run_dir.glob("*.pid")) and not (run_dir / "state.json").exists()
    assert streamrag("status", "--run-dir", str(run_dir)).returncode == 1


@pytest.mark.slow   # a whole stack with kills (`bash scripts/test.sh --run-slow`)
def test_killed_services_come_back_and_are_used_again(tiny_index: Path, run_dir: Path):
    up_tiny_stack(run_dir, tiny_index)
    before = services_of(run_dir)
    orchestrator = before["orchestrator"].target
    first = ask(orchestrator, stack_key(run_dir))
    time.sleep(2)                                       # Redis syncs its append-only file every second

    victims = ["inference-0", "anns", "redis"]
    for name in victims:
        os.kill(before[name].pid, signal.SIGKILL)
    deadline = time.monotonic() + 240                   # generous: the replica reloads the model
    while True:
        status, rows = status_rows(run_dir)
        now = services_of(run_dir)
        if status.returncode == 0 and all(now[name].restarts >= 1 for name in victims):
            break
        assert time.monotonic() < deadline, f"not back after 240 s:\n{status.stdout}"
        time.sleep(2)
    for name in victims:
        assert now[name].pid != before[name].pid and now[name].last_exit, now[name]
        assert " healthy " in rows[name] and rows[name].split()[4] == "1", rows[name]
    assert all(now[name].restarts == 0 for name in SERVICES - set(victims))
    log = (run_dir / "logs" / "supervisor.log").read_text()
    assert all(f"{name} started again" in log for name in victims), log

    # The orchestrator uses them again: its only replica answers, with ANNS context.
    deadline = time.monotonic() + 120
    while True:
        try:
            again = ask(orchestrator, stack_key(run_dir), "How do I read a file?")
            record = get_request(orchestrator, stack_key(run_dir), again.request_id)
            if any(e.kind == "RETRIEVAL_CHUNK" and e.fields.get("source") == "anns" for e in record.events):
                break
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, "the orchestrator did not use the restarted replica and retriever"
        time.sleep(2)
    assert again.replica == now["inference-0"].target
    # What Redis held before it was killed is still there (append-only file).
    stored = get_request(orchestrator, stack_key(run_dir), first.request_id)
    assert stored.state == orchestrator_pb2.REQUEST_STATE_FINISHED

    down = streamrag("down", "--run-dir", str(run_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert processes_in(run_dir) == []


def test_a_service_that_fails_is_named_with_its_log_and_nothing_stays_up(tiny_index: Path, tmp_path: Path,
                                                                          run_dir: Path):
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    up = streamrag("up", "--run-dir", str(run_dir), "--free-ports",
                   "--corpus-root", str(tiny_index.parent / "site"), "--index", str(tiny_index),
                   "--model", str(not_a_model), "--timeout", "120")
    assert up.returncode == 1
    assert "inference-0 failed" in up.stderr and "not a model directory" in up.stderr, up.stderr
    assert "inference-0.log" in up.stderr
    assert processes_in(run_dir) == []
    assert not (run_dir / "state.json").exists()


def free_port_offset(tiny_index: Path) -> int:
    """A --port-offset whose every planned port nothing listens on (the test needs fixed ports: the
    second `up` must bind the very ports the first one served on)."""
    import random

    for offset in random.Random().sample(range(1000, 14000, 7), 200):
        options = up_args(port_offset=offset, corpus_root=tiny_index.parent / "site")
        ports = [p for s in plan.plan_stack(options, tiny_index, 6379 + offset) for p in s.ports]
        if not any(processes.port_in_use(p) for p in ports):
            return offset
    raise AssertionError("no free port offset found")


def time_wait_ports() -> set[int]:
    """Local ports with a socket in TIME_WAIT (closed connections the kernel still remembers)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "06":
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def linger_in_time_wait(port: int, host: str = "127.0.0.1") -> None:
    """Leave a closed connection in TIME_WAIT on `port` (free) as a server's would: listen there as gRPC's
    servers bind, accept one connection, and close the server's side first."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind((host, port))
    listener.listen()
    client = socket.create_connection((host, port))
    accepted, _ = listener.accept()
    listener.close()
    accepted.close()                                   # the server side closes first: TIME_WAIT on `port`
    client.close()


@pytest.mark.slow   # a whole stack twice (`bash scripts/test.sh --run-slow`)
def test_down_then_up_at_once_on_the_same_ports(tiny_index: Path, run_dir: Path):
    offset = free_port_offset(tiny_index)
    up_args_ = ["up", "--run-dir", str(run_dir), "--port-offset", str(offset), "--replicas", "1",
                "--corpus-root", str(tiny_index.parent / "site"), "--index", str(tiny_index), "--timeout", "240"]
    first = streamrag(*up_args_)
    assert first.returncode == 0, first.stdout + first.stderr
    served = services_of(run_dir)
    orchestrator = served["orchestrator"].target
    # A client that keeps its connection (as the gateway or a load test does) while the stack goes down:
    # the orchestrator closes it, so the closed connection lingers in TIME_WAIT on the orchestrator's port.
    with keyed_channel(orchestrator, key=stack_key(run_dir)) as channel:
        for question in ("How do I close a file?", "How do I read a file?"):
            request = orchestrator_pb2.AskRequest(question=question, max_tokens=8,
                                                  retriever=orchestrator_pb2.RETRIEVER_CHOICE_ANNS)
            events = list(orchestrator_pb2_grpc.OrchestratorStub(channel).Ask(request, timeout=120))
            assert events[-1].event.WhichOneof("kind") == "done"
        down = streamrag("down", "--run-dir", str(run_dir))
        assert down.returncode == 0, down.stdout + down.stderr
    # Which side closes first (and so holds the TIME_WAIT) depends on timing: the orchestrator's shutdown, or
    # the client answering its GOAWAY. Where the client did, a server-side one is left on the port here.
    port = int(orchestrator.rsplit(":", 1)[1])
    if port not in time_wait_ports():
        linger_in_time_wait(port)
    assert port in time_wait_ports(), "the orchestrator's port should be in TIME_WAIT"

    again = streamrag(*up_args_)                       # at once: only TIME_WAIT sockets are left there
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already in use" not in again.stderr
    status, rows = status_rows(run_dir)
    assert status.returncode == 0 and all(" healthy " in row for row in rows.values()), status.stdout
    assert {s.name: s.ports for s in services_of(run_dir).values()} == {n: s.ports for n, s in served.items()}
    ask(orchestrator, stack_key(run_dir))
    assert streamrag("down", "--run-dir", str(run_dir)).returncode == 0


def test_a_port_is_busy_while_something_listens_not_while_closed_connections_linger():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)     # as gRPC's servers bind
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    assert processes.port_in_use(port)
    listener.close()
    linger_in_time_wait(port)
    assert port in time_wait_ports()
    assert not processes.port_in_use(port)


def grpc_health_error(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode | None:
    """How a health check over these credentials (None: plaintext) fails, or None when it answers."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
    return None


def test_up_with_a_tls_dir_serves_every_service_over_tls(tiny_index: Path, tmp_path: Path, run_dir: Path):
    from servicekit.tls import TlsFiles

    certs = tmp_path / "certs"                          # no CA there: up makes the certificates
    up = streamrag("up", "--run-dir", str(run_dir), "--free-ports", "--corpus-root", str(tiny_index.parent / "site"),
                   "--index", str(tiny_index), "--timeout", "240", "--tls-dir", str(certs))
    assert up.returncode == 0, up.stdout + up.stderr
    assert (certs / "ca.crt").is_file() and "mutual TLS between the services" in up.stdout
    services = services_of(run_dir)
    ca = (certs / "ca.crt").read_bytes()
    client = TlsFiles(certs / "client.crt", certs / "client.key", certs / "ca.crt")
    for name in ("anns", "crawler", "inference-0", "orchestrator"):
        target = services[name].target
        assert health.check_health("grpc", target, 5, client) is None, name             # mutual TLS
        assert grpc_health_error(target, None) is not None, name                         # plaintext
        assert grpc_health_error(target, grpc.ssl_channel_credentials()) is not None, name   # without the CA
        assert grpc_health_error(target, grpc.ssl_channel_credentials(ca)) is not None, name  # no client certificate
    gateway = services["gateway"].target
    assert gateway.startswith("https://") and health.check_health("http", gateway, 5, client) is None
    without_ca = health.check_health("http", gateway, 5)
    assert without_ca is not None and "CERTIFICATE_VERIFY_FAILED" in without_ca, without_ca
    assert health.check_health("http", gateway.replace("https://", "http://"), 5) is not None

    status = streamrag("status", "--run-dir", str(run_dir))
    assert status.returncode == 0 and "TLS: mutual TLS" in status.stdout, status.stdout + status.stderr
    with keyed_channel(services["orchestrator"].target, key=stack_key(run_dir), tls=client) as channel:
        request = orchestrator_pb2.AskRequest(question="How do I close a file?", max_tokens=8,
                                              retriever=orchestrator_pb2.RETRIEVER_CHOICE_ANNS)
        events = [r.event for r in orchestrator_pb2_grpc.OrchestratorStub(channel).Ask(request, timeout=120)]
    assert events[-1].WhichOneof("kind") == "done" and events[-1].done.answer, events[-1]   # the whole path over TLS
    asked = subprocess.run([str(STREAMRAG), "ask", "--max-tokens", "8", "--timeout", "120", "How do I close a file?"],
                           capture_output=True, text=True, timeout=180,
                           env=dict(os.environ, HF_HUB_OFFLINE="1", STREAMRAG_RUN_DIR=str(run_dir)))
    assert asked.returncode == 0 and asked.stdout.strip(), asked.stdout + asked.stderr     # the CLI finds the TLS files
    assert streamrag("down", "--run-dir", str(run_dir)).returncode == 0


def test_a_tls_dir_without_every_certificate_is_refused_before_anything_starts(tiny_index: Path, tmp_path: Path,
                                                                              run_dir: Path):
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.crt").write_text("a CA from elsewhere\n")
    up = streamrag("up", "--run-dir", str(run_dir), "--free-ports", "--corpus-root", str(tiny_index.parent / "site"),
                   "--index", str(tiny_index), "--tls-dir", str(certs))
    assert up.returncode == 1 and "anns.crt" in up.stderr and "streamrag certs" in up.stderr, up.stderr
    assert processes_in(run_dir) == [] and not (run_dir / "state.json").exists()


# ---------------------------------------------------------------- no services needed

def up_args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands.add_up_args(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_every_planned_command_is_one_the_cli_accepts():
    services = plan.plan_stack(up_args(replicas=3, port_offset=7), Path("/tmp/index"), redis_port=6386)
    parser = build_parser()
    for service in services:
        if service.kind == "redis":
            continue
        assert service.argv[:3] == [sys.executable, "-m", "streamrag.cli"]
        args = parser.parse_args(service.argv[3:])
        assert args.host == "127.0.0.1"
        assert args.port == int(service.target.rsplit(":", 1)[1].split("/")[0])
    orchestrator = parser.parse_args(orchestrator_of(services).argv[3:])
    assert orchestrator.inference == ["127.0.0.1:50059", "127.0.0.1:50060", "127.0.0.1:50061"]
    gateway = next(s for s in services if s.kind == "gateway")
    assert "--inference" not in gateway.argv       # the orchestrator alone knows the replicas
    assert orchestrator.redis == "redis://127.0.0.1:6386/0"


def test_the_plan_binds_each_port_once_even_with_the_most_replicas():
    services = plan.plan_stack(up_args(replicas=plan.MAX_REPLICAS), Path("/tmp/index"), redis_port=6379)
    ports = [port for s in services for port in s.ports]
    assert len(ports) == len(set(ports))
    assert {s.name for s in services} >= {"redis", "corpus", "anns", "crawler", "orchestrator", "inference-8"}


def test_an_external_redis_is_neither_started_nor_stopped():
    services = plan.plan_stack(up_args(redis="redis://10.0.0.5:6379/2"), Path("/tmp/index"), redis_port=6379)
    redis = services[0]
    assert redis.argv is None and redis.ports == []
    assert processes.stop_in_order(services, timeout_s=0.1) == []
    assert "--redis" in orchestrator_of(services).argv and "redis://10.0.0.5:6379/2" in orchestrator_of(services).argv


def test_health_checks_say_why_a_service_is_down():
    port = processes.free_port()
    assert health.check_health("grpc", f"127.0.0.1:{port}", 0.5) is not None
    assert health.check_health("http", f"http://127.0.0.1:{port}/index.html", 0.5) is not None
    assert health.check_health("redis", f"redis://127.0.0.1:{port}/0", 0.5) is not None
    probe = subprocess.run([sys.executable, "-m", "servicekit.health", "grpc", f"127.0.0.1:{port}",
                            "--timeout", "0.5"], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 1 and f"127.0.0.1:{port}" in probe.stderr


def test_redis_health_is_a_ping(redis_server):
    assert health.check_health("redis", redis_server.url) is None


def test_a_reused_pid_is_not_the_process_up_started():
    me = plan.Service("x", "corpus", "", ["x"], pid=os.getpid(), started=processes.process_start_ticks(os.getpid()))
    assert processes.is_running(me)
    me.started = (me.started or 0) - 1
    assert not processes.is_running(me)


def test_up_refuses_an_unknown_latency_profile_before_starting_anything(tmp_path: Path, capsys):
    assert commands.run_up(up_args(latency="fast", run_dir=tmp_path / "run")) == 2
    assert "--latency" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_status_and_down_with_no_stack(tmp_path: Path, capsys):
    args = argparse.Namespace(run_dir=tmp_path, timeout=1.0)
    assert commands.run_status(args) == 1
    assert commands.run_down(args) == 0
    assert "no stack is up" in capsys.readouterr().out


def sleeper() -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_dead_stack_is_forgotten(tmp_path: Path):
    dead = plan.Service("anns", "retriever", "127.0.0.1:1", sleeper(), pid=os.getpid(), started=-1)
    orchestrator = plan.Service("orchestrator", "orchestrator", "127.0.0.1:2", sleeper(), pid=os.getpid(), started=-1)
    state.write_state(tmp_path, state.StackState({"replicas": 1, "policy": "fcfs"}, [dead, orchestrator]))
    assert commands.already_up(tmp_path) is None
    assert state.read_stack(tmp_path) is None


def test_the_plan_keeps_redis_data_in_an_append_only_file_and_knows_the_replay_address():
    services = plan.plan_stack(up_args(port_offset=3), Path("/tmp/index"), redis_port=6382)
    redis = services[0].argv
    assert redis[redis.index("--appendonly") + 1] == "yes" and redis[redis.index("--dir") + 1] == "redis"
    assert plan.replay_target(services) == "127.0.0.1:50066"
    assert build_parser().parse_args(orchestrator_of(services).argv[3:]).replay == "127.0.0.1:50066"


def test_free_ports_gives_every_service_its_own_port_from_the_kernel():
    services = plan.plan_stack(up_args(replicas=3, free_ports=True), Path("/tmp/index"),
                               redis_port=processes.free_port(), free_port=processes.free_port)
    ports = [port for s in services for port in s.ports]
    assert len(ports) == len(set(ports)) == 15
    assert not set(ports) & {50051, 50052, 50053, 50054, 50061, 50062, 8765, 9100}
    assert plan.replay_target(services) not in {s.target for s in services}


# ---------------------------------------------------------------- the supervisor, in this process

class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def watched(tmp_path: Path):
    """A run directory with one sleeping service and this test process recorded as its supervisor."""
    (tmp_path / "logs").mkdir()
    service = plan.Service("corpus", "corpus", "http://127.0.0.1:1/", sleeper())
    first = processes.start_service(service, tmp_path)
    me = plan.Service("supervisor", "supervisor", str(tmp_path), ["x"], pid=os.getpid(),
                      started=processes.process_start_ticks(os.getpid()))
    state.write_state(tmp_path, state.StackState({"replicas": 1}, [service], me))
    lines: list[str] = []
    clock = FakeClock()
    watcher = supervisor.Supervisor(tmp_path, supervisor.Backoff(initial_s=1, max_s=4, reset_after_s=60),
                                    say=lines.append, clock=clock)
    yield tmp_path, first, watcher, clock, lines
    for proc in [first, *watcher.children.values()]:
        proc.kill()
        proc.wait()


def recorded_service(run_dir: Path) -> plan.Service:
    return state.read_state(run_dir).services[0]


def test_the_supervisor_starts_a_dead_service_again_after_a_back_off_that_doubles(watched):
    run_dir, first, watcher, clock, lines = watched
    assert watcher.tick() and not watcher.due                     # running: nothing to do
    first.kill()
    first.wait()
    assert watcher.tick() and "starting it again in 1 s" in lines[-1]
    assert recorded_service(run_dir).pid == first.pid              # not before the back-off
    clock.now += 1
    assert watcher.tick()
    again = recorded_service(run_dir)
    assert again.pid != first.pid and processes.is_running(again)
    assert again.restarts == 1 and again.last_exit == f"process {first.pid} is gone"
    assert "restarted by the supervisor" in (run_dir / "logs" / "corpus.log").read_text()

    os.kill(again.pid, signal.SIGKILL)                             # a crash in a row: twice the wait
    wait_gone(again.pid)
    assert watcher.tick() and "killed by SIGKILL" in lines[-1] and "again in 2 s" in lines[-1]
    clock.now += 2
    assert watcher.tick()
    third = recorded_service(run_dir)
    assert third.restarts == 2 and third.last_exit == "killed by SIGKILL" and processes.is_running(third)

    clock.now += 61                                                # ran long enough: the back-off starts over
    assert watcher.tick()
    os.kill(third.pid, signal.SIGKILL)
    wait_gone(third.pid)
    assert watcher.tick() and "again in 1 s" in lines[-1]


def test_the_supervisor_leaves_alone_a_service_someone_else_started_meanwhile(watched):
    run_dir, first, watcher, clock, _ = watched
    first.kill()
    first.wait()
    assert watcher.tick()
    recorded = state.read_state(run_dir)
    replacement = processes.start_service(recorded.services[0], run_dir)   # e.g. `up` or a deliberate restart
    try:
        state.write_state(run_dir, recorded)
        clock.now += 5
        assert watcher.tick()
        assert recorded_service(run_dir).pid == replacement.pid and recorded_service(run_dir).restarts == 0
    finally:
        replacement.kill()
        replacement.wait()


def test_the_supervisor_exits_when_the_stack_is_gone_or_has_another_supervisor(watched):
    run_dir, _, watcher, _, _ = watched
    recorded = state.read_state(run_dir)
    recorded.supervisor = replace_pid(recorded.supervisor)
    state.write_state(run_dir, recorded)
    assert not watcher.tick()
    state.clear_state(run_dir, recorded.services)
    assert not watcher.tick()


def replace_pid(service: plan.Service) -> plan.Service:
    return plan.Service(service.name, service.kind, service.target, service.argv, pid=1,
                        started=processes.process_start_ticks(1))


def test_backoff_doubles_up_to_its_cap():
    backoff = supervisor.Backoff(initial_s=1, max_s=30)
    assert [backoff.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_down_escalates_to_sigkill_for_a_process_that_ignores_sigterm():
    ignore_sigterm = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)"
    child = subprocess.Popen([sys.executable, "-c", ignore_sigterm + "; time.sleep(60)"], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        service = plan.Service("stubborn", "corpus", "", ["x"], pid=child.pid,
                                started=processes.process_start_ticks(child.pid))
        t0 = time.monotonic()
        killed = processes.stop_services([service], timeout_s=0.5)
        assert killed == ["stubborn"] and time.monotonic() - t0 < 5
        assert child.wait(timeout=5) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_up_hands_the_tenants_file_to_the_gateway_and_every_orchestrator():
    services = plan.plan_stack(up_args(orchestrators=2, tenants=Path("/etc/tenants.toml")), Path("/tmp/index"),
                               redis_port=6379)
    parser = build_parser()
    takers = [s for s in services if s.kind in ("gateway", "orchestrator")]
    assert len(takers) == 3
    assert all(parser.parse_args(s.argv[3:]).tenants == "/etc/tenants.toml" for s in takers)
    assert all("--tenants" not in (s.argv or ()) for s in services if s not in takers)


def test_up_refuses_a_bad_tenants_file_in_one_line_before_anything_starts(tmp_path: Path, run_dir: Path):
    bad = tmp_path / "tenants.toml"
    bad.write_text('[tenants.a]\nkeys = ["k"]\nmax_concurrent = -1\n')
    up = streamrag("up", "--run-dir", str(run_dir), "--free-ports", "--tenants", str(bad))
    assert up.returncode == 1 and up.stderr.strip().count("\n") == 0, up.stderr
    assert "line 3" in up.stderr and "max_concurrent must be positive" in up.stderr
    assert processes_in(run_dir) == []
