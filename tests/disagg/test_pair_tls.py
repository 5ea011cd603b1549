"""A prefill/decode pair whose replicas serve mutual TLS (the certificates scripts/make_certs.sh
makes): the prefill replica dials the decode replica presenting its own certificate, so the KV is
handed off over TLS, not fallen back from a refused plaintext call."""

from __future__ import annotations

import pytest

from protos.metadata import DECODE_TARGET_KEY
from tests.disagg.test_transfer import generate, kinds
from tests.support.gateway import make_certs, tls_files
from tests.support.inference import RunningInference
from tests.support.inference_calls import DOCS, HEAD, SUFFIX, append_msg, collect, finish_msg, open_msg, paced


def tls_replica(model_dir, certs, name: str, **options) -> RunningInference:
    """A replica serving mutual TLS, called by a client presenting the CA-signed `client` certificate."""
    return RunningInference(model_dir, tls=tls_files(certs, name), client_tls=tls_files(certs, "client"), **options)


@pytest.fixture(scope="module")
def tls_pair(embedded_model_dir, tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    prefill = tls_replica(embedded_model_dir, certs, "inference-0", role="prefill", kv_device_blocks=256)
    decode = tls_replica(embedded_model_dir, certs, "inference-1", role="decode", kv_device_blocks=256)
    yield prefill, decode
    prefill.stop()
    decode.stop()


def test_a_pair_serving_mutual_tls_hands_off_over_tls(tls_pair):
    prefill, decode = tls_pair
    want = generate(prefill.stub, HEAD + DOCS + SUFFIX, "reference-tls")
    messages = [open_msg("pair-tls", HEAD, max_tokens=24), *(append_msg(d) for d in DOCS), finish_msg(*SUFFIX)]
    answer = collect(prefill.stub.StreamPrompt(paced(messages, 0.1), timeout=120,
                                               metadata=((DECODE_TARGET_KEY, decode.address),)))
    assert answer.tokens == want.tokens
    events = kinds(answer)
    assert "KV_HANDOFF" in events and "KV_TRANSFER_FALLBACK" not in events
    assert decode.service.kv_transfer.calls == 1
