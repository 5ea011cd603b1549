"""One whole stack per module (model load, index build and servers take a few seconds)."""

from __future__ import annotations

import pytest

from tests.e2e.stack_harness import Stack


@pytest.fixture(scope="module")
def stack(embedded_model_dir, tmp_path_factory):
    stack = Stack(embedded_model_dir, tmp_path_factory.mktemp("stack"))
    yield stack
    stack.stop()
