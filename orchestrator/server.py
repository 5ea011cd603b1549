"""`streamrag serve orchestrator`: the Orchestrator service (Ask, GetRequest, ListRequests) and Sessions."""

from __future__ import annotations

import argparse
import asyncio

from orchestrator.admission import TenantGate
from orchestrator.discovery import DEFAULT_REFRESH_S, ReplicaDiscovery, split_targets
from orchestrator.inference_proxy import InferenceProxy
from orchestrator.lifecycle_store import LifecycleStore
from orchestrator.limits import LEASE_S, TenantLimits
from orchestrator.metrics import OrchestratorMetrics
from orchestrator.resume_claims import ResumeClaims
from orchestrator.router import ReplicaRouter
from orchestrator.servicer import OrchestratorServicer
from orchestrator.session_directory import SessionDirectory
from orchestrator.sessions_servicer import SessionsProxy
from orchestrator.tenancy import identity_interceptors
from protos import (
    inference_pb2,
    inference_pb2_grpc,
    orchestrator_pb2,
    orchestrator_pb2_grpc,
    retriever_pb2_grpc,
    sessions_pb2,
    sessions_pb2_grpc,
)
from servicekit.auth import ApiKeyInterceptor, ApiKeys, load_api_keys
from servicekit.channels import REDIAL_OPTIONS, open_channel
from servicekit.config import DEFAULT_PORTS, ServiceConfig, service_config_from_args
from servicekit.redis_url import RedisUrlError, check_reachable
from servicekit.server import ServiceRunner, configure_logging
from servicekit.tenants import Tenants, load_tenants, parse_tenants
from servicekit.tls import INFERENCE, TlsFiles, tls_from_args

SERVICE_NAME = orchestrator_pb2.DESCRIPTOR.services_by_name["Orchestrator"].full_name
SESSIONS_SERVICE_NAME = sessions_pb2.DESCRIPTOR.services_by_name["Sessions"].full_name
INFERENCE_SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name


class OrchestratorService:
    """Store + router + retriever channels + servicer + gRPC server, started and stopped as one.

    With `api_keys`, every RPC but health checks needs `authorization: Bearer KEY`; with `tls`,
    the port serves TLS (mutual when `tls.ca` is set)."""

    def __init__(self, config: ServiceConfig, *, redis_url: str, inference: list[str], retrievers: dict[str, str],
                 ttl_s: int = 86400, weights: tuple[float, ...] = (0.4, 0.1, 0.3, 0.2),
                 router_refresh_s: float = 1.0, api_keys: tuple[str, ...] = (), tls: TlsFiles | None = None,
                 dns_refresh_s: float = DEFAULT_REFRESH_S, tenants: Tenants | None = None,
                 lease_s: float = LEASE_S) -> None:
        """`tenants`: the tenants file's (servicekit/tenants.py); None: each of `api_keys` a tenant of its own.
        `lease_s`: how long a request's slot and a resume's claim outlive their last renewal (limits.py)."""
        tenants = tenants if tenants is not None else parse_tenants("", api_keys)
        api_keys = tenants.keys or api_keys
        self.store = LifecycleStore(redis_url, ttl_s=ttl_s)
        # `inference`: replica addresses and DNS names whose addresses are replicas (orchestrator.discovery).
        # A replica found by a name is verified against that name, one dialed by address as `inference`.
        # Every call to a replica carries the tenant and priority of the request it serves (tenancy.py).
        static, targets = split_targets(inference)
        self.router = ReplicaRouter(static, weights=weights, refresh_s=router_refresh_s, channel_factory=lambda address:
                                    open_channel(address, tls, options=self.discovery.channel_options(address),
                                                 server_name=INFERENCE, interceptors=identity_interceptors()))
        self.discovery = ReplicaDiscovery(self.router, targets, static, refresh_s=dns_refresh_s)
        # The retrievers honour the same keys: the orchestrator presents its own (the first) to them.
        self.channels = {name: open_channel(address, tls, api_key=ApiKeys(api_keys).own, server_name=name)
                         for name, address in retrievers.items() if address}
        stubs = {name: retriever_pb2_grpc.RetrieverStub(channel) for name, channel in self.channels.items()}
        self.metrics = OrchestratorMetrics()
        self.metrics.watch_store(self.store)
        limited = any(tenant.limited for tenant in tenants.tenants.values())
        self.limits = TenantLimits(redis_url, self.metrics.registry, lease_s=lease_s) if limited else None
        self.claims = ResumeClaims(redis_url, lease_s)
        self.gate = TenantGate(tenants, self.limits, self.metrics, self.store, claims=self.claims, lease_s=lease_s)
        self.metrics.watch_saturation(lambda: self.gate.saturation(self.router))   # `streamrag status` reads it
        self.servicer = OrchestratorServicer(self.router, stubs, self.store, self.metrics, self.gate)
        self.directory = SessionDirectory(redis_url, ttl_s=ttl_s)
        self.sessions = SessionsProxy(self.router, self.directory, self.store, self.gate)   # behind the gate too
        # Prompts without retrieval (the gateway's plain chats), routed and recorded like Asks.
        self.inference = InferenceProxy(self.router, self.store, self.metrics, self.gate)
        self.runner = ServiceRunner(config, [(orchestrator_pb2_grpc.add_OrchestratorServicer_to_server, self.servicer),
                                             (sessions_pb2_grpc.add_SessionsServicer_to_server, self.sessions),
                                             (inference_pb2_grpc.add_InferenceServicer_to_server, self.inference)],
                                    [SERVICE_NAME, SESSIONS_SERVICE_NAME, INFERENCE_SERVICE_NAME],
                                    registry=self.metrics.registry,
                                    interceptors=[ApiKeyInterceptor(ApiKeys(api_keys))] if api_keys else [], tls=tls,
                                    options=REDIAL_OPTIONS)    # gateways dial orchestrators by DNS name

    async def start(self, handle_signals: bool = True) -> int:
        await self.store.start()
        await self.discovery.start()
        await self.router.start()
        return await self.runner.start(handle_signals=handle_signals)

    async def stop(self, grace_s: float | None = None) -> None:
        await self.runner.stop(grace_s)
        await self.sessions.aclose()
        await self.discovery.stop()
        await self.router.stop()
        await self.store.close()
        await self.directory.close()
        if self.limits is not None:
            await self.limits.close()
        await self.claims.close()
        for channel in self.channels.values():
            await channel.close()


def parse_weights(text: str) -> tuple[float, ...]:
    try:
        weights = tuple(float(w) for w in text.split(","))
    except ValueError:
        raise SystemExit(f"error: --router-weights {text!r} is not four comma-separated numbers") from None
    if len(weights) != 4 or any(w < 0 for w in weights):
        raise SystemExit(f"error: --router-weights needs four non-negative numbers, got {text!r}")
    return weights


async def serve(args: argparse.Namespace) -> None:
    configure_logging(args.log_level)
    inference = args.inference or [f"127.0.0.1:{DEFAULT_PORTS['inference']}"]
    api_keys, tls = load_api_keys(args.api_key_file), tls_from_args(args)
    try:                                    # a bad URL, or Sentinels none of which answers: one line
        check_reachable(args.redis)
    except RedisUrlError as exc:
        raise SystemExit(f"error: --redis: {exc}") from None
    tenants = load_tenants(getattr(args, "tenants", None), api_keys)
    try:
        service = OrchestratorService(service_config_from_args("orchestrator", args), redis_url=args.redis,
                                      inference=inference,
                                      retrievers={"anns": args.anns, "crawler": args.crawler, "replay": args.replay},
                                      ttl_s=args.ttl, weights=parse_weights(args.router_weights),
                                      api_keys=api_keys, tls=tls, dns_refresh_s=args.dns_refresh, tenants=tenants,
                                      lease_s=args.tenant_lease)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    port = await service.start()
    served_tls = "" if tls is None or not tls.serves else ", mutual TLS" if tls.ca else ", TLS"
    security = (", API key required" if api_keys else "") + served_tls
    print(f"orchestrator on {args.host}:{port} (metrics :{service.runner.metrics_port}{security})", flush=True)
    await service.runner.wait()
    await service.discovery.stop()
    await service.router.stop()
    await service.store.close()
    await service.directory.close()


def main(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    import sys

    from orchestrator.server_args import add_orchestrator_args
    from servicekit.config import run_command

    sys.exit(run_command("python -m orchestrator.server", add_orchestrator_args, main))
