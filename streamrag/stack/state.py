"""The run directory of the local stack: what `up` started, where its logs are, one `up`/`down` at a time.

    state.json            the stack: options, per service its argv, address, pid, start time and
                          restarts, and the supervisor (`streamrag.stack.supervisor`)
    <service>.pid         the pid alone (`kill $(cat orchestrator.pid)` works); supervisor.pid too
    logs/<service>.log    the service's stdout and stderr (rewritten by `up`, appended to by restarts)
    logs/supervisor.log   what the supervisor saw and restarted
    redis/                the private Redis's working directory (its append-only file)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from servicekit.config import default_cache_dir
from streamrag.stack.plan import Service

STATE_FILE = "state.json"


def default_run_dir() -> Path:
    env = os.environ.get("STREAMRAG_RUN_DIR")
    return Path(env).expanduser() if env else default_cache_dir() / "run"


def resolve_run_dir(run_dir: Path | None) -> Path:
    return (run_dir or default_run_dir()).expanduser().resolve()


def log_path(run_dir: Path, name: str) -> Path:
    return run_dir / "logs" / f"{name}.log"


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """One `up`/`down` at a time per run directory."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass
class StackState:
    """Everything state.json holds: `up`'s options, the services, and the supervisor (None: not started)."""

    options: dict
    services: list[Service]
    supervisor: Service | None = None


def write_state(run_dir: Path, state: StackState) -> None:
    data = {"version": 1, "options": state.options, "services": [asdict(s) for s in state.services],
            "supervisor": asdict(state.supervisor) if state.supervisor else None}
    partial = run_dir / f".{STATE_FILE}.partial"
    partial.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(partial, run_dir / STATE_FILE)


def read_state(run_dir: Path | None = None) -> StackState | None:
    """The stack recorded in `run_dir`, or None when there is none."""
    path = (run_dir or default_run_dir()) / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    supervisor = data.get("supervisor")
    return StackState(data["options"], [Service(**s) for s in data["services"]],
                      Service(**supervisor) if supervisor else None)


def read_stack(run_dir: Path | None = None) -> tuple[dict, list[Service]] | None:
    """The stack recorded in `run_dir` (options, services), or None when there is none.

    Other commands use it to find the running stack (its orchestrator and Redis addresses).
    """
    state = read_state(run_dir)
    return None if state is None else (state.options, state.services)


def clear_state(run_dir: Path, services: list[Service]) -> None:
    for name in [s.name for s in services] + ["supervisor"]:
        (run_dir / f"{name}.pid").unlink(missing_ok=True)
    (run_dir / STATE_FILE).unlink(missing_ok=True)


def use_stack_key(run_dir: Path | None = None) -> None:
    """Clients of the local stack present its key (`streamrag up` made it) unless one is set already, and
    for a stack up with --tls-dir dial it with TLS, presenting its client certificate (`servicekit.tls.client_tls`)
    unless a client CA is set already."""
    from servicekit.auth import API_KEY_ENV, API_KEY_FILE_ENV
    from servicekit.config import env_name
    from streamrag.stack.tls import stack_client_tls

    recorded = read_stack(run_dir)
    options = recorded[0] if recorded is not None else {}
    if options.get("api_key_file") and not (os.environ.get(API_KEY_ENV) or os.environ.get(API_KEY_FILE_ENV)):
        os.environ[API_KEY_FILE_ENV] = options["api_key_file"]
    tls = stack_client_tls(options)
    if tls is not None and not os.environ.get(env_name("client", "tls_ca")):
        for name, path in (("tls_ca", tls.ca), ("tls_cert", tls.cert), ("tls_key", tls.key)):
            os.environ[env_name("client", name)] = str(path)
