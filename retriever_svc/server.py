"""`streamrag serve retriever --kind anns|crawler|replay`: one Retriever service process.

With `--api-key-file` (or `STREAMRAG_API_KEY`) every RPC but health checks, Collections included,
needs `authorization: Bearer KEY`, as on the orchestrator; with `--tls-cert/--tls-key` the port
serves TLS, mutual with `--tls-ca` (`servicekit.auth`, `servicekit.tls`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Callable, Coroutine

from protos import retriever_pb2, retriever_pb2_grpc
from retriever_svc.server_args import default_port
from retriever_svc.service import RetrieverBackend, RetrieverMetrics, RetrieverServicer
from servicekit.auth import ApiKeyInterceptor, ApiKeys, load_api_keys
from servicekit.config import DEFAULT_PORTS, ServiceConfig, metrics_port_for, service_config_from_args
from servicekit.server import ServiceRunner, configure_logging
from servicekit.tls import TlsFiles, tls_from_args, tls_note

SERVICE_NAME = retriever_pb2.DESCRIPTOR.services_by_name["Retriever"].full_name
COLLECTIONS_SERVICE = retriever_pb2.DESCRIPTOR.services_by_name["Collections"].full_name
# kind -> module exposing `build_backend(args) -> RetrieverBackend`
BACKENDS = {"anns": "retriever_svc.anns.backend", "crawler": "retriever_svc.crawler",
            "replay": "retriever_svc.replay.backend"}
# --backend of the ANNS kind -> its module (same `build_backend`)
ANNS_BACKENDS = {"diskannpy": "retriever_svc.anns.backend", "milvus": "retriever_svc.milvus.backend"}


def build_backend(args: argparse.Namespace) -> RetrieverBackend:
    module = BACKENDS[args.kind]
    if args.kind == "anns":
        module = ANNS_BACKENDS[getattr(args, "backend", "diskannpy")]
    return importlib.import_module(module).build_backend(args)


def service_config(args: argparse.Namespace) -> ServiceConfig:
    config = service_config_from_args("anns", args)
    if args.kind != "anns":   # the flags defaulted to the ANNS ports: move to this kind's
        port = default_port(args.kind) if args.port == DEFAULT_PORTS["anns"] else args.port
        metrics = config.metrics_port
        if metrics == metrics_port_for("anns"):
            metrics = metrics_port_for("crawler") if args.kind == "crawler" else metrics_port_for("anns") + 20
        config = ServiceConfig(service=args.kind, host=args.host, port=port, metrics_port=metrics, grace_s=args.grace)
    return config


def build_runner(config: ServiceConfig, backend: RetrieverBackend, metrics: RetrieverMetrics | None = None, *,
                 api_keys: tuple[str, ...] = (), tls: TlsFiles | None = None,
                 ) -> tuple[ServiceRunner, list[Callable[[], Coroutine]]]:
    """The gRPC server of one retriever (Retriever, and Collections where the backend has them) and the
    background work to run beside it. With `api_keys`, callers must present one; with `tls`, the port
    serves TLS (mutual when `tls.ca` is set)."""
    metrics = metrics or RetrieverMetrics()
    servicers = [(retriever_pb2_grpc.add_RetrieverServicer_to_server, RetrieverServicer(backend, metrics))]
    names = [SERVICE_NAME]
    background = []
    if backend.has_collections:
        from retriever_svc.collections.servicer import CollectionsServicer

        collections = CollectionsServicer(backend)
        servicers.append((retriever_pb2_grpc.add_CollectionsServicer_to_server, collections))
        names.append(COLLECTIONS_SERVICE)
        background.append(collections.merge_in_background)
    interceptors = [ApiKeyInterceptor(ApiKeys(api_keys))] if api_keys else []
    return ServiceRunner(config, servicers, names, registry=metrics.registry, interceptors=interceptors,
                         tls=tls), background


async def serve(args: argparse.Namespace) -> None:
    configure_logging(args.log_level)
    api_keys, tls = load_api_keys(args.api_key_file), tls_from_args(args)   # checked before the index loads
    backend = build_backend(args)
    runner, background = build_runner(service_config(args), backend, api_keys=api_keys, tls=tls)
    port = await runner.start()
    tasks = [asyncio.ensure_future(work()) for work in background]
    security = ", ".join(note for note in ("API key required" if api_keys else "", tls_note(tls)) if note)
    print(f"{args.kind} retriever on {args.host}:{port} (metrics :{runner.metrics_port})"
          f"{', ' + security if security else ''}", flush=True)
    await runner.wait()
    for task in tasks:
        task.cancel()
    await asyncio.to_thread(backend.close)


def main(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    import sys

    from retriever_svc.server_args import add_retriever_args
    from servicekit.config import run_command

    sys.exit(run_command("python -m retriever_svc.server", add_retriever_args, main))
