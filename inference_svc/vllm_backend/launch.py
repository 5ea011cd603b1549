"""Starting a vLLM-backed Inference service: in-process for `streamrag serve inference --backend vllm`,
or as a subprocess for benchmarks and tests (`start_vllm_service`, on `inference_svc.launch`).

    from inference_svc.vllm_backend.launch import start_vllm_service
    service = start_vllm_service(model_dir, port=0, max_streams=64)   # waits until it serves
    channel = grpc.insecure_channel(service.address)                   # Generate = vLLM-NS, StreamPrompt = vLLM-S
    ...
    service.stop()

The subprocess keeps vllm (and its engine-core process) out of the caller's interpreter; it
needs an interpreter where the vllm extra is installed (`python=`, default $STREAMRAG_VLLM_PYTHON,
else this one).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from inference_svc.launch import ServiceHandle, start_inference_service
from servicekit.config import ServiceConfig


def build_vllm_service(args: argparse.Namespace, model_dir: Path, config: ServiceConfig):
    """The service for parsed `streamrag serve inference --backend vllm` flags (imports vllm)."""
    from inference_svc.server import policy_options
    from inference_svc.vllm_backend.config import UnsupportedConfiguration, VllmSpec, vllm_available

    if not vllm_available():
        raise SystemExit("error: --backend vllm needs vllm in this Python: see docs/vllm.md "
                         "(python3.11 -m inference_svc.vllm_backend.install /opt/vllm-venv)")
    from inference_svc.vllm_backend.service import VllmInferenceService

    try:
        spec = VllmSpec(model_dir=model_dir, device=args.device, dtype=args.dtype, policy=args.policy,
                        block_size=args.block_size, kv_device_bytes=args.kv_device_bytes,
                        kv_device_blocks=args.kv_device_blocks, token_budget=args.token_budget,
                        max_running=args.max_running, eviction=args.eviction or "recompute",
                        policy_options=tuple(policy_options(args).items()))
    except UnsupportedConfiguration as exc:
        raise SystemExit(f"error: {exc}") from None
    return VllmInferenceService(spec, config, args.max_streams)


def start_vllm_service(model_dir: Path | str | None = None, port: int = 0, max_streams: int = 256, *,
                       python: str | None = None, **options) -> ServiceHandle:
    """`start_inference_service("vllm", ...)`; `python` defaults to $STREAMRAG_VLLM_PYTHON."""
    return start_inference_service("vllm", model_dir, port, max_streams,
                                   python=python or os.environ.get("STREAMRAG_VLLM_PYTHON"), **options)
