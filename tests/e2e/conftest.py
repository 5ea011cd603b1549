"""One whole stack per module (model load, index build and servers take a few seconds), and two
replicas behind an orchestrator for the failover tests (tests/support/stack.py runs both)."""

from __future__ import annotations

import pytest

from tests.support.stack import Stack, replicas_behind_an_orchestrator


@pytest.fixture(scope="module")
def stack(embedded_model_dir, tmp_path_factory):
    stack = Stack(embedded_model_dir, tmp_path_factory.mktemp("stack"))
    yield stack
    stack.stop()


@pytest.fixture
def two_replicas(embedded_model_dir, tmp_path):
    """(stub, orchestrator service, replicas, channel, redis). The router refreshes its stats rarely
    here, so it keeps trusting a replica that just died."""
    with replicas_behind_an_orchestrator(embedded_model_dir, tmp_path, (None, None), router_refresh_s=3600) as running:
        orchestrator = running.orchestrator
        yield orchestrator.stub, orchestrator.service, running.replicas, orchestrator.channel, running.redis
