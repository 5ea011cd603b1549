"""A prefill/decode pair whose replicas serve mutual TLS (the certificates scripts/make_certs.sh
makes): the prefill replica dials the decode replica presenting its own certificate, so the KV is
handed off over TLS, not fallen back from a refused plaintext call."""

from __future__ import annotations

import grpc
import pytest

from protos import inference_pb2_grpc
from protos.metadata import DECODE_TARGET_KEY
from tests.disagg.conftest import RunningReplica
from tests.disagg.test_transfer import DOCS, HEAD, SUFFIX, generate, kinds
from tests.gateway.harness import make_certs, tls_files
from tests.service.inference_harness import append_msg, collect, finish_msg, open_msg, paced


class TlsReplica(RunningReplica):
    """A replica serving mutual TLS, called by a client presenting the CA-signed `client` certificate."""

    def __init__(self, model_dir, certs, name: str, **options) -> None:
        super().__init__(model_dir, tls=tls_files(certs, name), **options)
        self.channel.close()     # the harness's plaintext channel: this replica wants a certificate
        self.channel = grpc.secure_channel(self.address, tls_files(certs, "client").channel_credentials())
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)


@pytest.fixture(scope="module")
def tls_pair(embedded_model_dir, tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    prefill = TlsReplica(embedded_model_dir, certs, "inference-0", role="prefill", kv_device_blocks=256)
    decode = TlsReplica(embedded_model_dir, certs, "inference-1", role="decode", kv_device_blocks=256)
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
