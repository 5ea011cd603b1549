"""Replicas with disaggregation (the service `streamrag serve inference` runs), on loopback."""

from __future__ import annotations

from inference_svc.disagg.service import DisaggInferenceService
from servicekit.config import ServiceConfig
from servicekit.tls import TlsFiles
from tests.service.inference_harness import RunningInference


class RunningReplica(RunningInference):
    """`RunningInference` serving `KvTransfer` too, with a role."""

    def __init__(self, model_dir, *, role: str = "both", tls: TlsFiles | None = None, **options) -> None:
        self.role = role
        self.tls = tls
        super().__init__(model_dir, **options)

    async def _start(self) -> int:
        self.service = DisaggInferenceService(self.spec, ServiceConfig("inference", port=0, metrics_port=0),
                                              self.max_streams, role=self.role)
        self.service.runner.tls = self.tls         # as `streamrag serve inference --tls-*` sets it
        return await self.service.start(handle_signals=False)
