"""Where the CLI's commands reach the services: the addresses the local stack recorded (`streamrag up`),
else the defaults, and the channel that dials the orchestrators (with the client's key and TLS, which
`streamrag.stack.state.use_stack_key` sets for the local stack)."""

from __future__ import annotations

import grpc

from servicekit.auth import keyed_channel
from servicekit.channels import spread_options, spread_target
from servicekit.config import DEFAULT_PORTS
from servicekit.tls import ORCHESTRATORS
from streamrag.stack.state import read_stack

DEFAULT_ORCHESTRATOR = f"127.0.0.1:{DEFAULT_PORTS['orchestrator']}"


def stack_service_target(name: str) -> str | None:
    """The address of a service of the stack `streamrag up` started, if one is recorded."""
    recorded = read_stack()
    if recorded is None:
        return None
    return next((s.target for s in recorded[1] if s.name == name), None)


def stack_orchestrators() -> str | None:
    """Every orchestrator of the stack `streamrag up` started ("a:port,b:port"), if one is recorded."""
    recorded = read_stack()
    targets = [s.target for s in recorded[1] if s.kind == "orchestrator"] if recorded is not None else []
    return ",".join(targets) or None


def orchestrator_address(given: str | None) -> str:
    """Where the commands ask: `given` (one address, or several comma-separated), else every orchestrator
    of the local stack, else the default. Dial it with `orchestrator_channel` (or `spread_target`)."""
    return given or stack_orchestrators() or DEFAULT_ORCHESTRATOR


def orchestrator_channel(address: str) -> grpc.Channel:
    """A (sync) channel over every orchestrator in `address`, round_robin with health checking."""
    return keyed_channel(spread_target(address), spread_options(wait_for_ready=False), server_name=ORCHESTRATORS)
