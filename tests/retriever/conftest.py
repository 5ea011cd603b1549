"""Fixtures of the retriever tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def corpus(tiny_corpus: Path):
    """The corpus web server on the tiny corpus, on a free port."""
    from retriever_svc.corpus.web_server import CorpusServer

    with CorpusServer(tiny_corpus) as server:
        yield server


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory) -> Path:
    """The tiny corpus's index (five passages), built once per test module (a module may define its own)."""
    from tests.retriever import build_tiny_index

    return build_tiny_index(tmp_path_factory.mktemp("collections-tiny"))
