"""Replicas with disaggregation (the service `streamrag serve inference` runs), on loopback."""

from __future__ import annotations

from inference_svc.disagg.service import DisaggInferenceService
from servicekit.config import ServiceConfig
from tests.service.inference_harness import RunningInference


class RunningReplica(RunningInference):
    """`RunningInference` serving `KvTransfer` too, with a role."""

    def __init__(self, model_dir, *, role: str = "both", **options) -> None:
        self.role = role
        super().__init__(model_dir, **options)

    async def _start(self) -> int:
        self.service = DisaggInferenceService(self.spec, ServiceConfig("inference", port=0, metrics_port=0),
                                              self.max_streams, role=self.role)
        return await self.service.start(handle_signals=False)
