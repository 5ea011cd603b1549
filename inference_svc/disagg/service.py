"""The native Inference service with disaggregation: `NativeInferenceService` plus the `KvTransfer`
service (this replica decodes what a prefill replica ships it) and hand-offs (it prefills for a
decode replica when a StreamPrompt call asks). `role` is what `GetStats` reports, for the router's
pairing; every replica serves every call whatever its role."""

from __future__ import annotations

from inference_svc.disagg.receiver import SERVICE_NAME as KV_TRANSFER_SERVICE_NAME
from inference_svc.disagg.receiver import KvTransferServicer
from inference_svc.disagg.servicer import DisaggServicer
from inference_svc.engine.factory import EngineSpec
from inference_svc.engine.kv_export import layout_of
from inference_svc.native.service import SESSIONS_SERVICE_NAME, NativeInferenceService
from inference_svc.options import DEFAULT_MAX_SESSIONS, DEFAULT_MAX_STREAMS, DEFAULT_ROLE
from inference_svc.rpc.servicer import SERVICE_NAME
from protos import inference_pb2_grpc, kv_transfer_pb2_grpc, sessions_pb2_grpc
from servicekit.channels import open_channel
from servicekit.config import ServiceConfig
from servicekit.server import ServiceRunner
from servicekit.tls import INFERENCE


class DisaggInferenceService(NativeInferenceService):
    def __init__(self, spec: EngineSpec, config: ServiceConfig, max_streams: int = DEFAULT_MAX_STREAMS,
                 max_sessions: int = DEFAULT_MAX_SESSIONS, role: str = DEFAULT_ROLE) -> None:
        super().__init__(spec, config, max_streams, max_sessions)
        self.kv_transfer = KvTransferServicer(self.thread, layout_of(self.engine),
                                              self.engine.scheduler.pools()[0].num_blocks)
        # A hand-off dials the decode replica with this replica's own TLS files (mutual TLS: it presents
        # its certificate as on every call between services); read at dial time, since the server sets
        # `runner.tls` after construction.
        self.servicer = DisaggServicer(self.thread, self.servicer.model_info, self.metrics, max_streams, role=role,
                                       receiver=self.kv_transfer,
                                       channel_factory=lambda target: open_channel(target, self.runner.tls,
                                                                                   server_name=INFERENCE))
        servicers = [(inference_pb2_grpc.add_InferenceServicer_to_server, self.servicer),
                     (sessions_pb2_grpc.add_SessionsServicer_to_server, self.sessions_servicer),
                     (kv_transfer_pb2_grpc.add_KvTransferServicer_to_server, self.kv_transfer)]
        self.runner = ServiceRunner(config, servicers, [SERVICE_NAME, SESSIONS_SERVICE_NAME, KV_TRANSFER_SERVICE_NAME],
                                    registry=self.metrics.registry)

    def _after_step(self, seconds: float | None, events: list) -> None:
        self.servicer.after_step(self.engine)    # ship what the step computed
        super()._after_step(seconds, events)

    async def stop(self, grace_s: float | None = None) -> None:
        await super().stop(grace_s)
        await self.servicer.close_channels()
