"""The inference service's Prometheus metrics expose speculative decoding: drafted and accepted
tokens, the acceptance ratio and the draft depth per step."""

from __future__ import annotations

from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.native.metrics import StepMetrics
from inference_svc.rpc.metrics import InferenceMetrics
from tests.engine.engine_helpers import fake_engine
from tests.engine.test_speculation import PROMPT, quoting


def test_metrics_report_drafts_acceptance_and_depth():
    engine = fake_engine(predict=quoting)
    metrics = InferenceMetrics()
    step_metrics = StepMetrics(metrics)
    engine.open("r", [Segment(token_ids=PROMPT)], SamplingParams(max_tokens=30, speculation="4"))
    engine.finish("r")
    while engine.has_unfinished():
        step_metrics.observe(engine, 0.01, engine.step())
    value = metrics.registry.get_sample_value
    assert value("streamrag_draft_tokens_total") == engine.counters.draft_tokens > 0
    assert value("streamrag_accepted_draft_tokens_total") == engine.counters.accepted_draft_tokens > 0
    assert value("streamrag_draft_acceptance") == engine.counters.accepted_draft_tokens / engine.counters.draft_tokens
    assert value("streamrag_draft_depth_count") > 0
    assert value("streamrag_draft_depth_sum") == engine.counters.draft_tokens
