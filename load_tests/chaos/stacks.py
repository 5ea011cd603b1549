"""Where the soak finds the stack's services and how it hurts them: `streamrag up`'s run directory
(processes) or a compose project (containers).

Both give the same few things: the orchestrators' addresses, the key and the TLS files a client
dials them with (`tls`: None for plaintext; for a stack with mutual TLS, a client certificate and
the CA), the inference replicas, an `incarnation` of each service that changes when it is started
again, whether it is up (running and answering its health check), a signal (`kill`: SIGKILL;
`stop`/`cont`: SIGSTOP/SIGCONT) and each replica's KV pools (free, total) and what holds them, for
the leak check.

The run directory is read as `streamrag.stack.state` writes it (state.json: per service its
name, kind, health target, pid and /proc start time); `load_tests` may not import `streamrag`, so
this reads the file, not the module. A signal goes to the service's whole process group (each
service runs in its own session), as `docker kill` reaches a whole container.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from servicekit.health import check_health
from servicekit.tls import TlsFiles

SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}
# How each kind of service in state.json is probed (the local stack's plan says the same).
CHECK_OF_KIND = {"redis": "redis", "corpus": "http", "gateway": "http", "retriever": "grpc", "inference": "grpc",
                 "orchestrator": "grpc"}


@dataclass(frozen=True)
class ServiceInfo:
    name: str          # "inference-0", "anns", "crawler", "orchestrator", "redis", ...
    kind: str          # "inference", "retriever", "orchestrator", "redis", "corpus", "gateway"
    target: str        # what its health check probes (host:port, URL)


def start_ticks(pid: int) -> int | None:
    """A live process's start time from /proc (None: gone or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def replica_stats(address: str, tls: TlsFiles | None = None, key: str | None = None, timeout_s: float = 5.0) -> dict:
    """One inference replica's KV pools {pool: [free, total]} and what holds them (GetStats), dialed as every
    client of the stack dials (`servicekit.auth.keyed_channel`: over TLS when `tls` names a CA, with `key`)."""
    from protos import inference_pb2, inference_pb2_grpc
    from servicekit.auth import keyed_channel

    with keyed_channel(address, key=key, tls=tls) as channel:
        return stats_summary(inference_pb2_grpc.InferenceStub(channel).GetStats(inference_pb2.GetStatsRequest(),
                                                                                timeout=timeout_s))


def stats_summary(response) -> dict:
    """What the leak check reads of a replica's GetStatsResponse."""
    stats = response.stats
    return {"pools": {p.name: [p.free_blocks, p.total_blocks] for p in stats.pools}, "sessions": stats.num_sessions,
            "running": stats.num_running, "waiting": stats.num_waiting, "swapped": stats.num_swapped}


class LocalStack:
    """A stack `streamrag up` started, found through its run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        state = self._state()
        if state is None:
            raise FileNotFoundError(f"no stack is up in {run_dir} (no state.json)")
        # every orchestrator ("a:port,b:port"): clients spread asks over them as `streamrag ask` does
        self.orchestrator = ",".join(s["target"] for s in state["services"] if s["kind"] == "orchestrator")
        key_file = state["options"].get("api_key_file")
        self.key = Path(key_file).read_text().strip() if key_file else os.environ.get("STREAMRAG_API_KEY") or None
        # a stack up with --tls-dir: the `client` certificate, as its own checks and `streamrag ask` present
        # (streamrag.stack.tls.stack_client_tls)
        tls_dir = state["options"].get("tls_dir")
        self.tls = TlsFiles(Path(tls_dir) / "client.crt", Path(tls_dir) / "client.key", Path(tls_dir) / "ca.crt") \
            if tls_dir else None
        self.dtype = state["options"].get("dtype", "")
        self.services = {s["name"]: ServiceInfo(s["name"], s["kind"], s["target"]) for s in state["services"]}

    def _state(self) -> dict | None:
        for _ in range(20):                      # written by os.replace: a read never sees half a file
            try:
                return json.loads((self.run_dir / "state.json").read_text())
            except FileNotFoundError:
                return None
            except ValueError:
                time.sleep(0.05)
        return None

    def _record(self, name: str) -> dict:
        state = self._state()
        if state is None:
            raise RuntimeError(f"the stack in {self.run_dir} is gone")
        return next(s for s in state["services"] if s["name"] == name)

    @property
    def replicas(self) -> list[ServiceInfo]:
        return [s for s in self.services.values() if s.kind == "inference"]

    def incarnation(self, name: str) -> str | None:
        """The running process as "pid/start" (None: not running)."""
        record = self._record(name)
        pid, started = record.get("pid"), record.get("started")
        if pid is None or start_ticks(pid) != started:
            return None
        return f"{pid}/{started}"

    def is_up(self, name: str, timeout_s: float = 2.0) -> bool:
        service = self.services[name]
        return self.incarnation(name) is not None and \
            check_health(CHECK_OF_KIND[service.kind], service.target, timeout_s, self.tls) is None

    def signal(self, name: str, action: str) -> str:
        """Send `action`'s signal to the service's process group; returns what was hit ("pid 123")."""
        record = self._record(name)
        pid = record.get("pid")
        if pid is None or start_ticks(pid) != record.get("started"):
            raise ProcessLookupError(f"{name} is not running")
        os.killpg(pid, SIGNALS[action])
        return f"pid {pid}"

    def replica_stats(self, replica: ServiceInfo) -> dict:
        return replica_stats(replica.target, self.tls, self.key)


# Run in a replica's container (`exec`, the replicas are not published), with protos and servicekit alone:
# its GetStatsResponse, serialized in base64 (stats_summary reads it here), over the replica's own TLS files
# when compose's TLS override gives it some (its certificate names 127.0.0.1, and the replica takes it from
# a caller as any the CA signed).
REPLICA_STATS = """
import base64, os
from pathlib import Path
import grpc
from protos import inference_pb2, inference_pb2_grpc
from servicekit.tls import TlsFiles
cert, key, ca = (os.environ.get(f"STREAMRAG_INFERENCE_TLS_{part}") for part in ("CERT", "KEY", "CA"))
address = "127.0.0.1:%d"
channel = grpc.secure_channel(address, TlsFiles(Path(cert), Path(key), Path(ca)).channel_credentials()) \\
    if ca else grpc.insecure_channel(address)
with channel:
    response = inference_pb2_grpc.InferenceStub(channel).GetStats(inference_pb2.GetStatsRequest(), timeout=5)
print(base64.b64encode(response.SerializeToString()).decode())
"""


class ComposeStack:
    """A compose project's containers (`COMPOSE -p PROJECT -f FILE -f ...`, the files in the order `up` was
    given them). `orchestrator` is where the host reaches every orchestrator ("127.0.0.1:p,127.0.0.1:q": the
    project must publish their ports, which compose/docker-compose.yml does not; tests/compose's chaos override
    does), dialed with `key` and `tls` as a client of the stack would. A kill is SIGKILL of the container's
    main process from the host: Docker counts `docker kill` as a deliberate stop and its restart policy
    leaves the container down, while a crash is restarted. A freeze is `docker kill -s STOP` (and `-s CONT`),
    which leaves it running."""

    REPLICAS = ("inference-0", "inference-1")
    KINDS: ClassVar[dict[str, str]] = {
        "redis": "redis", "corpus": "corpus", "anns": "retriever", "crawler": "retriever",
        "inference-0": "inference", "inference-1": "inference", "orchestrator": "orchestrator",
        "orchestrator-1": "orchestrator"}
    REPLICA_PORT = 50052

    def __init__(self, compose: list[str], project: str, files: Sequence[Path | str], orchestrator: str,
                 cwd: Path, env: dict[str, str] | None = None, key: str | None = None, tls: TlsFiles | None = None,
                 dtype: str = "auto") -> None:
        self.base = [*compose, "-p", project, *(arg for file in files for arg in ("-f", str(file)))]
        self.cwd, self.env, self.orchestrator, self.key, self.tls = cwd, env, orchestrator, key, tls
        self.dtype = dtype             # what the replicas serve ("auto": the images' default, bf16 where the CPU has)
        self.services = {name: ServiceInfo(name, kind, name) for name, kind in self.KINDS.items()}

    def _container(self, name: str) -> str:
        out = subprocess.run([*self.base, "ps", "-q", name], cwd=self.cwd, env=self.env, capture_output=True,
                             text=True, timeout=60)
        return out.stdout.strip()

    def _inspect(self, name: str) -> dict:
        out = subprocess.run(["docker", "inspect", self._container(name)], capture_output=True, text=True,
                             timeout=60)
        return json.loads(out.stdout)[0] if out.returncode == 0 else {}

    @property
    def replicas(self) -> list[ServiceInfo]:
        return [self.services[name] for name in self.REPLICAS]

    def incarnation(self, name: str) -> str | None:
        state = self._inspect(name).get("State", {})
        return f"{state['Pid']}/{state['StartedAt']}" if state.get("Running") and state.get("Pid") else None

    def is_up(self, name: str, timeout_s: float = 2.0) -> bool:
        state = self._inspect(name).get("State", {})
        return bool(state.get("Running")) and state.get("Health", {}).get("Status", "healthy") == "healthy"

    def signal(self, name: str, action: str) -> str:
        if action == "kill":
            pid = self._inspect(name)["State"]["Pid"]
            os.kill(pid, signal.SIGKILL)
            return f"container {name} pid {pid}"
        sig = {"stop": "STOP", "cont": "CONT"}[action]
        subprocess.run(["docker", "kill", "-s", sig, self._container(name)], check=True, capture_output=True,
                       timeout=60)
        return f"container {name}"

    def replica_stats(self, replica: ServiceInfo) -> dict:
        """Read inside the replica's container (REPLICA_STATS)."""
        out = subprocess.run(["docker", "exec", "-i", self._container(replica.name), "python", "-"],
                             input=REPLICA_STATS % self.REPLICA_PORT, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"GetStats in {replica.name}'s container failed ({out.returncode}): "
                               f"{out.stderr.strip()[-300:]}")
        from protos import inference_pb2

        return stats_summary(inference_pb2.GetStatsResponse.FromString(
            base64.b64decode(out.stdout.strip().splitlines()[-1])))
