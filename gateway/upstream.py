"""The service behind the gateway: the orchestrator, for every request.

RAG requests are `Orchestrator.Ask`. Plain chats and completions (`Inference.Generate`) and the
WebSocket's streamed input (`Inference.StreamPrompt`) go to the orchestrator's `Inference`
service (orchestrator/inference_proxy.py), which picks the replica with the same router as an
Ask and records the request in the Redis lifecycle store like every Ask: the gateway keeps no
replica list and no routing rule of its own.

The served model's `Describe` (name, chat format) is asked once and cached. The gateway calls
with its own API key (the first one it accepts) when it has keys, and dials with TLS when it
has a CA (`servicekit.channels.open_channel`). With a plain call it also names the question to
record (`protos.metadata.QUESTION_KEY`: the user's last message).

The orchestrator address may name several orchestrators ("127.0.0.1:50051,127.0.0.1:50061", or
a DNS name that resolves to each): the channel spreads calls over them with gRPC's own
`round_robin` and health checking (`servicekit.channels.spread_options`), so a dead or stopped
orchestrator gets no new call while another is up. Every call on the channel waits for one to be
ready (gRPC's `waitForReady`), within that call's own timeout: a request made while the
orchestrator restarts, or just after (the channel in its reconnect back-off), waits instead of
failing at once. An Ask whose orchestrator dies mid-answer is re-issued as a resume
(`servicekit.ask_resume`, in generation.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from gateway.errors import GatewayError, model_not_found
from protos import inference_pb2, inference_pb2_grpc, orchestrator_pb2_grpc
from protos.metadata import QUESTION_KEY
from servicekit.auth import bearer_metadata
from servicekit.channels import open_channel, spread_options, spread_target
from servicekit.tls import ORCHESTRATORS, TlsFiles

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT_S = 2.0
# gRPC refuses metadata over 8 KiB (soft) / 16 KiB (hard): the question is cut to this many bytes.
QUESTION_METADATA_BYTES = 1024


@dataclass
class Upstream:
    """The channel to the orchestrator; open with `start()`, close with `close()`."""

    orchestrator_address: str
    api_key: str | None = None
    tls: TlsFiles | None = None
    info: inference_pb2.ModelInfo | None = None      # the served model's Describe, once it answered

    async def start(self) -> None:
        self._channel = open_channel(spread_target(self.orchestrator_address), self.tls, options=spread_options(),
                                     server_name=ORCHESTRATORS)
        self.orchestrator = orchestrator_pb2_grpc.OrchestratorStub(self._channel)
        self.inference = inference_pb2_grpc.InferenceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call presents: the key."""
        return bearer_metadata(self.api_key)

    def plain_metadata(self, question: str) -> tuple[tuple[str, str | bytes], ...]:
        """A plain call's metadata: the key and the question the lifecycle store records (its first KiB)."""
        text = question.encode("utf-8")[:QUESTION_METADATA_BYTES].decode("utf-8", "ignore").encode("utf-8")
        return (*self.metadata, *(((QUESTION_KEY, text),) if text else ()))

    async def describe(self) -> inference_pb2.ModelInfo | None:
        """The served model's ModelInfo (cached once it answered), None while no replica answers."""
        if self.info is None:
            try:
                response = await self.inference.Describe(inference_pb2.DescribeRequest(), timeout=DESCRIBE_TIMEOUT_S,
                                                         metadata=self.metadata)
            except grpc.RpcError as exc:
                log.warning("Describe through the orchestrator failed: %s %s", exc.code().name, exc.details())
                return None
            self.info = response.model_info
        return self.info

    async def served_models(self) -> list[str]:
        """The name of the model the replicas serve (none while no replica answers)."""
        info = await self.describe()
        return [info.model] if info is not None else []

    async def model_info(self, model: str) -> inference_pb2.ModelInfo:
        """The ModelInfo of `model` (404 if the replicas serve another, 503 if none answers)."""
        info = await self.describe()
        if info is None:
            raise GatewayError(503, "no inference replica is reachable")
        if info.model != model:
            raise model_not_found(model)
        return info
