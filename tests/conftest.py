"""Fixtures and opt-in markers shared by every suite.

Markers `slow`, `cuda`, `vllm` and `compose` are skipped unless asked for:
    bash scripts/test.sh --run-slow --run-cuda --run-vllm
    bash scripts/test.sh tests/compose --run-compose     # builds and runs the compose stack (dockerd)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# First: the engine package chooses Triton's interpreter on a machine without CUDA, before anything a
# test imports can import triton (inference_svc/engine/__init__.py).
import inference_svc.engine  # noqa: F401
from tests.support.redis_server import PrivateRedis
from tests.support.stack import run_dir  # noqa: F401 - the fixture, for every suite
from tests.support.tiny_corpus import build_tiny_corpus

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Benches a test runs (in-process or as subprocesses) never take the machine-wide CPU lock: a test must not
# wait on a user's benchmark (load_tests/runner.py).
os.environ["STREAMRAG_CPU_LOCK"] = "off"

# Property tests draw the same examples on every run and every machine (derandomized: Hypothesis seeds them
# from each test), so the default suite passes or fails alike everywhere and a failure found once is found
# again on the next run, printed with its `@reproduce_failure` blob. No deadline: this is a loaded machine,
# and a test asserts behaviour, not time. Hypothesis keeps no example database when derandomized; to search
# with fresh random draws, its database kept in .hypothesis/: `pytest --hypothesis-profile=explore`.
settings.register_profile("streamrag", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("streamrag")

OPT_IN = {
    "slow": "slow test: run with --run-slow",
    "cuda": "needs an NVIDIA GPU: run with --run-cuda on a CUDA machine",
    "vllm": "needs the vllm extra (pip install -e '.[vllm]'): run with --run-vllm",
    "compose": "builds and runs the compose stack (needs dockerd and docker-compose): run with --run-compose",
    "milvus": "runs the embedded Milvus server (about 2 minutes; scripts/setup.sh installs it): run with --run-milvus",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "compose: builds and runs the compose stack (run with --run-compose)")
    config.addinivalue_line("markers", "milvus: runs the embedded Milvus server (run with --run-milvus)")


def pytest_addoption(parser: pytest.Parser) -> None:
    for marker in OPT_IN:
        parser.addoption(f"--run-{marker}", action="store_true", default=False, help=OPT_IN[marker])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, reason in OPT_IN.items():
        if config.getoption(f"--run-{marker}"):
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            # The marker itself, not `item.keywords`: that also holds node names, and the
            # package tests/compose/ would match the `compose` marker.
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private redis-server on a free port; `.url` is its redis:// URL."""
    server = PrivateRedis(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """A directory with five linked HTML pages (see tests/support/tiny_corpus.py)."""
    return build_tiny_corpus(tmp_path / "site")


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory) -> Path:
    """The tiny corpus's index (five passages, under `.parent / "site"`), built once per test module."""
    from tests.retriever import build_tiny_index

    return build_tiny_index(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a Hugging Face directory (prepared once, cached)."""
    from inference_svc.embedded_model import prepare_embedded_model

    return prepare_embedded_model(progress=False)
