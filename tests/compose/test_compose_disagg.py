"""The compose stack with prefill and decode apart (opt-in, like the compose suite): the override
compose/docker-compose.disagg.yml on top of the TLS one, so inference-0 prefills and hands each
streamed RAG chat's KV to inference-1 over mutual TLS, which decodes.

    bash scripts/test.sh tests/compose/test_compose_disagg.py --run-compose
"""

from __future__ import annotations

import pytest

from tests.compose.test_compose_stack import ask, running_stack

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def disagg_stack(request):
    with running_stack(request, overrides=("compose/docker-compose.disagg.yml",)) as s:
        yield s


def test_a_streamed_chat_is_prefilled_on_one_replica_and_decoded_on_the_other(disagg_stack):
    request_id, answer, extension = ask(disagg_stack, streamed=True)
    assert answer and extension["replica"] == "inference-0:50052"     # the prefill side answers the call
    record = disagg_stack.records(request_id)[request_id]
    assert record.get("state") == "REQUEST_STATE_FINISHED", record
    kinds = [e["kind"] for e in record["events"]]
    assert "KV_TRANSFER_START" in kinds and "KV_HANDOFF" in kinds, kinds
    assert "KV_TRANSFER_FALLBACK" not in kinds, kinds                  # the mutual-TLS hand-off held
    assert kinds.index("KV_HANDOFF") < kinds.index("FIRST_TOKEN")
    handoff = next(e for e in record["events"] if e["kind"] == "KV_HANDOFF")
    assert "bytes" in handoff["fields"]["detail"], handoff
