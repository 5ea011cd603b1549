"""A real Inference service with the embedded model (fp32, so answers are exact), shared per module."""

from __future__ import annotations

import pytest

from tests.support.inference import RunningInference


@pytest.fixture(scope="module")
def inference(embedded_model_dir):
    service = RunningInference(embedded_model_dir, token_budget=256, policy="fcfs", max_streams=48)
    yield service
    service.stop()
