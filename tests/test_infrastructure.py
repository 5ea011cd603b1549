"""The test infrastructure itself: private Redis, the tiny corpus, the CLI's command list, and the service
runners' one readiness rule (tests/support/serving.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.support.gateway import GatewayProcess
from tests.support.serving import ChildProcess, wait_serving

REPO = Path(__file__).resolve().parents[1]


def test_private_redis_is_isolated_and_answers(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    assert client.ping()
    assert redis_server.port != 6379
    client.set("streamrag:test", "1")
    assert client.dbsize() == 1


def test_tiny_corpus_pages_link_to_existing_pages(tiny_corpus: Path):
    pages = sorted(tiny_corpus.rglob("*.html"))
    assert len(pages) >= 5
    for page in pages:
        for href in re.findall(r'href="([^"]+)"', page.read_text()):
            assert (page.parent / href).resolve().exists(), f"{page.name} links to missing {href}"


def test_cli_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "streamrag.cli", "--help"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    for command in ("model", "demo"):
        assert command in out


def test_cli_reports_an_unknown_command_without_a_traceback():
    proc = subprocess.run([sys.executable, "-m", "streamrag.cli", "no-such-command"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr and "Traceback" not in proc.stderr


def test_a_runner_is_ready_when_its_health_says_so_and_says_why_when_it_exits_first(tmp_path: Path):
    gateway = GatewayProcess("127.0.0.1:1", tmp_path / "gateway.log")     # no orchestrator: /health still serves
    try:
        wait_serving(f"{gateway.base_url}/health", check="http", timeout_s=5)
    finally:
        gateway.stop()
    assert gateway.process.returncode is not None
    doomed = ChildProcess([sys.executable, "-c", "print('bye')"], "127.0.0.1:1", tmp_path / "doomed.log", what="doomed")
    with pytest.raises(RuntimeError, match="doomed: exited with 0") as caught:
        doomed.start()
    assert "bye" in str(caught.value)
