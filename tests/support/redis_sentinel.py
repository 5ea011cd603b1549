"""A Redis primary, its replica and three Sentinels, all real `redis-server` processes on free
loopback ports, so a test can kill the primary and watch a replica take its place.

    with SentinelSet(tmp_path) as redis_set:
        store = LifecycleStore(redis_set.url)       # redis+sentinel://127.0.0.1:A,.../streamrag/0
        redis_set.kill_primary()                    # SIGKILL; returns once the Sentinels promoted the replica
        redis_set.restart_old_primary()             # back on its port; the Sentinels make it a replica

The Sentinels call the primary down after `down_after_ms` without an answer (1 s here, so a failover
takes a few seconds) and need two of three to agree.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.support.redis_server import PrivateRedis, free_port

MASTER = "streamrag"


class SentinelSet:
    def __init__(self, workdir: Path, *, sentinels: int = 3, down_after_ms: int = 1000) -> None:
        self.workdir = workdir
        self.down_after_ms = down_after_ms
        self.sentinel_ports: list[int] = []
        self._sentinels: list[subprocess.Popen] = []
        self.servers: list[PrivateRedis] = []
        try:
            (workdir / "primary").mkdir(parents=True, exist_ok=True)
            (workdir / "replica").mkdir(parents=True, exist_ok=True)
            fast_sync = ("--repl-diskless-sync-delay", "0")    # a replica syncs at once, not 5 s later
            primary = PrivateRedis(workdir / "primary", extra_args=fast_sync)
            replica = PrivateRedis(workdir / "replica",
                                   extra_args=(*fast_sync, "--replicaof", "127.0.0.1", str(primary.port)))
            self.servers = [primary, replica]
            for i in range(sentinels):
                self._start_sentinel(i, primary.port)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        self.url = f"redis+sentinel://{','.join(f'127.0.0.1:{p}' for p in self.sentinel_ports)}/{MASTER}/0"

    def _start_sentinel(self, index: int, primary_port: int) -> None:
        port = free_port()
        config = self.workdir / f"sentinel-{index}.conf"
        config.write_text(f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                          f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n"
                          f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
                          f"sentinel failover-timeout {MASTER} 5000\n"
                          f"sentinel parallel-syncs {MASTER} 1\n")
        binary = shutil.which("redis-server") or "redis-server"
        self._sentinels.append(subprocess.Popen([binary, str(config), "--sentinel", "--loglevel", "warning"],
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.sentinel_ports.append(port)

    def _ask(self, port: int, *command: str):
        client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1, decode_responses=True)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until every Sentinel knows the primary, its replica and the other Sentinels (a failover
        needs them), and the replica is in sync."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                ready = all(len(self._ask(p, "SENTINEL", "REPLICAS", MASTER)) >= 1
                            and len(self._ask(p, "SENTINEL", "SENTINELS", MASTER)) >= len(self.sentinel_ports) - 1
                            for p in self.sentinel_ports)
                info = self._ask(self.primary_port(), "INFO", "replication")
                if ready and info.get("slave0", {}).get("state") == "online":
                    return
            except (redis.RedisError, KeyError, TypeError):
                pass
            time.sleep(0.2)
        raise RuntimeError("the Sentinels did not see the primary, its replica and each other in time")

    def primary_port(self) -> int:
        """The port of the primary as the first Sentinel that answers names it now."""
        for port in self.sentinel_ports:
            try:
                address = self._ask(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
            except redis.RedisError:
                continue
            if address:
                return int(address[1])
        raise RuntimeError("no Sentinel answers")

    def server(self, port: int) -> PrivateRedis:
        return next(s for s in self.servers if s.port == port)

    def kill_primary(self, timeout_s: float = 60.0) -> PrivateRedis:
        """SIGKILL the primary, then wait until the Sentinels name another one; returns the killed one."""
        old = self.server(self.primary_port())
        old.kill()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.primary_port() != old.port:
                    return old
            except RuntimeError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the Sentinels promoted no replica in time")

    def restart(self, server: PrivateRedis, timeout_s: float = 60.0) -> None:
        """Start a killed server again on its port; the Sentinels turn a former primary into a replica."""
        server.restart()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                role = self._ask(server.port, "ROLE")
                if role[0] == "slave" and role[3] == "connected":
                    return
            except redis.RedisError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"redis-server on port {server.port} did not become a replica in time")

    def stop(self) -> None:
        for process in self._sentinels:
            if process.poll() is None:
                process.terminate()
        for process in self._sentinels:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for server in self.servers:
            server.stop()

    def __enter__(self) -> SentinelSet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
