"""The services behind the gateway: the orchestrator, and the inference replicas plain chats go to.

RAG requests go to the orchestrator (`Ask`), which has its own router. The Orchestrator API
has no call that picks a replica for someone else's prompt, so for plain chats (and the
WebSocket) the gateway keeps its own short replica list (`--inference ADDR`, repeatable) and
picks per request, simply: it asks every replica serving the model for `GetStats` (0.5 s
deadline) and takes the shortest queue (waiting + swapped), then the fewest active requests,
then the first listed. A replica that does not answer is skipped for that request.

Each replica's `Describe` (model name, chat format) is asked once and cached. The gateway
calls the orchestrator with its own API key (the first one it accepts) when it has keys, and
dials every service with TLS when it has a CA (`servicekit.channels.open_channel`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from gateway.errors import GatewayError, model_not_found
from protos import inference_pb2, inference_pb2_grpc, orchestrator_pb2_grpc
from servicekit.auth import bearer_metadata
from servicekit.channels import open_channel
from servicekit.tls import TlsFiles

log = logging.getLogger(__name__)

STATS_TIMEOUT_S = 0.5
DESCRIBE_TIMEOUT_S = 2.0


@dataclass(eq=False)
class Replica:
    address: str
    stub: inference_pb2_grpc.InferenceStub
    info: inference_pb2.ModelInfo | None = None     # Describe, once it answered


@dataclass
class Upstream:
    """Channels to the orchestrator and the replicas; open with `start()`, close with `close()`."""

    orchestrator_address: str
    inference_addresses: Sequence[str]
    api_key: str | None = None
    tls: TlsFiles | None = None
    replicas: list[Replica] = field(default_factory=list)

    async def start(self) -> None:
        self._orchestrator_channel = open_channel(self.orchestrator_address, self.tls)
        self.orchestrator = orchestrator_pb2_grpc.OrchestratorStub(self._orchestrator_channel)
        self._channels = [open_channel(address, self.tls) for address in self.inference_addresses]
        self.replicas = [Replica(address, inference_pb2_grpc.InferenceStub(channel))
                         for address, channel in zip(self.inference_addresses, self._channels, strict=True)]

    async def close(self) -> None:
        for channel in [self._orchestrator_channel, *self._channels]:
            await channel.close()

    @property
    def orchestrator_metadata(self) -> tuple[tuple[str, str], ...]:
        return bearer_metadata(self.api_key)

    async def describe(self, replica: Replica) -> inference_pb2.ModelInfo | None:
        """The replica's ModelInfo (cached once it answered), None while it does not answer."""
        if replica.info is None:
            try:
                response = await replica.stub.Describe(inference_pb2.DescribeRequest(), timeout=DESCRIBE_TIMEOUT_S)
            except grpc.RpcError as exc:
                log.warning("replica %s: Describe failed: %s", replica.address, exc.code().name)
                return None
            replica.info = response.model_info
        return replica.info

    async def served_models(self) -> list[str]:
        """The names of the models the reachable replicas serve, in replica order, each once."""
        infos = await asyncio.gather(*(self.describe(r) for r in self.replicas))
        return list(dict.fromkeys(info.model for info in infos if info is not None))

    async def pick_replica(self, model: str) -> tuple[Replica, inference_pb2.ModelInfo]:
        """The replica serving `model` with the shortest queue (404 if none serves it, 503 if none answers)."""
        infos = await asyncio.gather(*(self.describe(r) for r in self.replicas))
        serving = [r for r, info in zip(self.replicas, infos, strict=True) if info is not None and info.model == model]
        if not serving:
            if any(info is not None for info in infos) or not self.replicas:
                raise model_not_found(model)
            raise GatewayError(503, "no inference replica is reachable")
        stats = await asyncio.gather(*(self._stats(r) for r in serving))
        ranked = [(s.num_waiting + s.num_swapped, s.num_active, i) for i, s in enumerate(stats) if s is not None]
        if not ranked:
            raise GatewayError(503, f"no inference replica serving {model!r} answers")
        chosen = serving[min(ranked)[2]]
        return chosen, chosen.info

    async def _stats(self, replica: Replica) -> inference_pb2.EngineStats | None:
        try:
            response = await replica.stub.GetStats(inference_pb2.GetStatsRequest(), timeout=STATS_TIMEOUT_S)
        except grpc.RpcError as exc:
            log.warning("replica %s: GetStats failed: %s", replica.address, exc.code().name)
            return None
        return response.stats
