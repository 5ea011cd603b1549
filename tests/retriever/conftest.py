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
