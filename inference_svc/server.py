"""`streamrag serve inference` (also `python -m inference_svc.server`): start an Inference service.

Starting a service, in the order it happens:
1. the flags (`server_args.add_inference_args`) are checked, and the model directory found
   (`checked_model_dir`: the embedded model unless `--model` names one); the device KV pool must
   hold one whole sequence of the length served (`checked_pool`, the rule in `rpc.limits`, the
   same for both backends): otherwise the service exits at once, naming the flag and a value that works;
2. the flags become the chosen backend's spec: an `EngineSpec` for the native engine
   (`native_spec`), a `VllmSpec` for vLLM (`vllm_spec`);
3. the backend's service object is built from its spec (`disagg.service.DisaggInferenceService`: the
   native service plus KV transfer between replicas, `--role`; `vllm_backend.service.VllmInferenceService`:
   the same start/stop/runner surface);
4. it starts, prints the line `launch.py` waits for, and serves until a signal ends it.

For a service in its own process (benchmarks, tests), see `inference_svc.launch`.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from inference_svc.disagg.service import DisaggInferenceService
from inference_svc.engine.engine import EngineConfig
from inference_svc.engine.factory import EngineSpec
from inference_svc.engine.options import DEFAULT_BLOCK_SIZE, DEFAULT_EVICTION
from inference_svc.native.service import NativeInferenceService
from inference_svc.rpc.limits import ModelShape, PoolTooSmall, check_pool_holds_context, served_len
from servicekit.config import ServiceConfig, service_config_from_args
from servicekit.server import configure_logging
from servicekit.tls import tls_from_args, tls_note

if TYPE_CHECKING:
    from inference_svc.vllm_backend.config import VllmSpec
    from inference_svc.vllm_backend.service import VllmInferenceService

POSITIVE_FLAGS = ("kv_device_blocks", "kv_device_bytes", "kv_cpu_blocks", "token_budget", "max_running",
                  "max_streams", "block_size", "max_model_len")


def checked_model_dir(args: argparse.Namespace) -> Path:
    """Check the numeric flags and the model directory (the embedded model by default); the token budget
    left unsaid becomes the device's default."""
    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.options import default_token_budget

    if args.token_budget is None:
        args.token_budget = default_token_budget(args.device)

    for name in POSITIVE_FLAGS:
        value = getattr(args, name, None)
        if value is not None and value < (0 if name == "kv_cpu_blocks" else 1):
            raise SystemExit(f"error: --{name.replace('_', '-')} must be positive, got {value}")
    model_dir = args.model or prepare_embedded_model(progress=False)
    if not (Path(model_dir) / "config.json").exists():
        raise SystemExit(f"error: {model_dir} is not a model directory (no config.json)")
    return Path(model_dir)


def checked_pool(args: argparse.Namespace, model_dir: Path) -> None:
    """Exit with one line unless the device pool the flags give holds one whole sequence of the length
    served (`rpc.limits.check_pool_holds_context`), before any engine starts. vLLM keeps one block of
    its pool back (its null block), and needs it to hold `max_model_len` or it fails inside its engine
    core; the native engine would shrink what it serves to the pool. Same rule for both."""
    from inference_svc.engine.factory import DEFAULT_KV_DEVICE_BYTES
    from inference_svc.vllm_backend.config import (
        DEFAULT_CPU_KV_GIB,
        GIB,
        VLLM_RESERVED_BLOCKS,
        UnsupportedConfiguration,
        check_block_size,
        default_block_size,
    )
    from servicekit.hardware import resolve_dtype

    shape = ModelShape.from_model_dir(model_dir)
    on_cpu = args.device == "cpu"
    if args.backend == "vllm":
        try:
            check_block_size(args.block_size, on_cpu)
        except UnsupportedConfiguration as exc:
            raise SystemExit(f"error: {exc}") from None
        block_size, reserved = args.block_size or default_block_size(on_cpu), VLLM_RESERVED_BLOCKS
        default_bytes = DEFAULT_CPU_KV_GIB * GIB if on_cpu else None   # CUDA: vLLM's memory fraction
    else:
        block_size, reserved, default_bytes = args.block_size or DEFAULT_BLOCK_SIZE, 0, DEFAULT_KV_DEVICE_BYTES
    if block_size is None:
        return
    per_block = shape.bytes_per_block(block_size, resolve_dtype(args.dtype, args.device))
    if args.kv_device_blocks is not None:
        flag, blocks, unit = "--kv-device-blocks", args.kv_device_blocks, None
    else:
        size = args.kv_device_bytes if args.kv_device_bytes is not None else default_bytes
        if size is None:
            return
        if args.backend == "vllm" and on_cpu:        # VLLM_CPU_KVCACHE_SPACE: whole GiB (config.py)
            size = max(1, -(-size // GIB)) * GIB
        flag, blocks, unit = "--kv-device-bytes", size // per_block, per_block
    try:
        check_pool_holds_context(sequence_tokens=served_len(shape.context_tokens, args.max_model_len),
                                 block_size=block_size, blocks=blocks, reserved_blocks=reserved, flag=flag,
                                 bytes_per_block=unit, context_tokens=shape.context_tokens)
    except PoolTooSmall as exc:
        raise SystemExit(f"error: {exc}") from None


def policy_options(args: argparse.Namespace) -> dict:
    """Options of the chosen policy from the flags (both backends)."""
    starvation_s = getattr(args, "lcas_starvation_s", None)
    options = {"starvation_s": starvation_s} if args.policy == "lcas" and starvation_s is not None else {}
    if getattr(args, "fair_share", "off") == "on":
        options["fair_share"] = True                 # between tenants (engine/fair_share.py)
    return options


def native_spec(args: argparse.Namespace, model_dir: Path) -> EngineSpec:
    return EngineSpec(
        model_dir=model_dir, device=args.device, dtype=args.dtype, kv_device_blocks=args.kv_device_blocks,
        kv_device_bytes=args.kv_device_bytes, kv_cpu_blocks=args.kv_cpu_blocks,
        engine=EngineConfig(block_size=args.block_size or DEFAULT_BLOCK_SIZE, token_budget=args.token_budget,
                            max_model_len=args.max_model_len,
                            step_time_target_ms=args.step_time_target_ms,
                            max_running=args.max_running, policy=args.policy,
                            eviction=args.eviction or DEFAULT_EVICTION, policy_options=policy_options(args),
                            speculative_share=args.speculative_share,
                            speculative_reserve_share=args.speculative_reserve_share,
                            speculative_append_share=args.speculative_append_share,
                            kv_reuse=args.kv_reuse, blend_recompute=args.blend_recompute,
                            chunk_store_fill=args.chunk_store_fill))


def vllm_spec(args: argparse.Namespace, model_dir: Path) -> VllmSpec:
    """The `VllmSpec` for the flags; exits with a message when vllm is missing or cannot honour them."""
    from inference_svc.vllm_backend.config import UnsupportedConfiguration, VllmSpec, vllm_available

    if not vllm_available():
        raise SystemExit("error: --backend vllm needs vllm in this Python: see docs/vllm.md "
                         "(python3.11 -m inference_svc.vllm_backend.install /opt/vllm-venv)")
    try:
        return VllmSpec(model_dir=model_dir, device=args.device, dtype=args.dtype, policy=args.policy,
                        block_size=args.block_size, kv_device_bytes=args.kv_device_bytes,
                        kv_device_blocks=args.kv_device_blocks, token_budget=args.token_budget,
                        max_running=args.max_running, eviction=args.eviction or "recompute",
                        policy_options=tuple(policy_options(args).items()),
                        max_model_len=None if args.max_model_len is None else
                        served_len(ModelShape.from_model_dir(model_dir).context_tokens, args.max_model_len))
    except UnsupportedConfiguration as exc:
        raise SystemExit(f"error: {exc}") from None


def build_service(args: argparse.Namespace, config: ServiceConfig) -> NativeInferenceService | VllmInferenceService:
    """The service for parsed flags, on the backend `--backend` names; its port serves TLS (mutual
    with --tls-ca) when --tls-cert/--tls-key are given."""
    tls = tls_from_args(args)        # checked before the model loads: a missing file fails at once
    model_dir = checked_model_dir(args)
    checked_pool(args, model_dir)
    if args.backend == "vllm":
        spec = vllm_spec(args, model_dir)
        from inference_svc.vllm_backend.service import VllmInferenceService  # imports vllm: only on this path

        service = VllmInferenceService(spec, config, args.max_streams, role=args.role)
    else:
        service = DisaggInferenceService(native_spec(args, model_dir), config, args.max_streams, args.max_sessions,
                                         role=args.role)
    service.runner.tls = tls          # the ServiceRunner binds its port with these at start()
    return service


async def serve(args: argparse.Namespace) -> None:
    configure_logging(args.log_level)
    service = build_service(args, service_config_from_args("inference", args))
    port = await service.start()
    served = tls_note(service.runner.tls)      # after the parenthesis: launch.READY reads up to it
    print(f"inference service on {args.host}:{port} (metrics :{service.runner.metrics_port})"
          f"{', ' + served if served else ''}", flush=True)
    await service.runner.wait()
    service.shutdown()


def main(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    import sys

    from inference_svc.server_args import add_inference_args
    from servicekit.config import run_command

    sys.exit(run_command("python -m inference_svc.server", add_inference_args, main))
