"""Flags of `streamrag serve inference` (kept free of heavy imports so `--help` is instant).

Choice lists and defaults come from `inference_svc.engine.options` (the engine's) and
`inference_svc.options` (the service's), the one places they are written; the engine's
dataclasses take theirs from there too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from inference_svc.engine.options import (
    CHUNK_STORE_FILL_CHOICES,
    DEFAULT_BLEND_RECOMPUTE,
    DEFAULT_CHUNK_STORE_FILL,
    DEFAULT_CUDA_TOKEN_BUDGET,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_EVICTION,
    DEFAULT_KV_CPU_BLOCKS,
    DEFAULT_KV_REUSE,
    DEFAULT_MAX_RUNNING,
    DEFAULT_POLICY,
    DEFAULT_SPECULATIVE_APPEND_SHARE,
    DEFAULT_SPECULATIVE_RESERVE_SHARE,
    DEFAULT_SPECULATIVE_SHARE,
    DEFAULT_STEP_TIME_TARGET_MS,
    DEFAULT_TOKEN_BUDGET,
    DTYPE_CHOICES,
    EVICTION_CHOICES,
    KV_REUSE_CHOICES,
    POLICY_CHOICES,
    blend_recompute_arg,
    share_arg,
    speculative_share_arg,
    step_time_target_arg,
)
from inference_svc.options import (
    BACKEND_CHOICES,
    DEFAULT_BACKEND,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_STREAMS,
    DEFAULT_ROLE,
    ROLE_CHOICES,
)
from servicekit.config import add_service_args, env_default
from servicekit.tls import add_tls_args

__all__ = ["BACKEND_CHOICES", "DTYPE_CHOICES", "EVICTION_CHOICES", "POLICY_CHOICES", "add_inference_args"]


def add_inference_args(parser: argparse.ArgumentParser) -> None:
    add_service_args(parser, "inference")
    env = lambda key, default: env_default("inference", key, default)  # noqa: E731
    parser.add_argument("--model", type=Path, default=env("model", None),
                        help="Hugging Face model directory (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default=env("device", DEFAULT_DEVICE), help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default=env("dtype", DEFAULT_DTYPE), choices=DTYPE_CHOICES)
    parser.add_argument("--policy", default=env("policy", DEFAULT_POLICY), choices=POLICY_CHOICES)
    parser.add_argument("--fair-share", default=env("fair_share", "on"), choices=("on", "off"),
                        help="share steps between tenants by weighted virtual token counters, the policy ordering "
                             "each tenant's requests (default on; off: the policy's order across everyone)")
    parser.add_argument("--eviction", default=env("eviction", None), choices=EVICTION_CHOICES,
                        help=f"default: {DEFAULT_EVICTION} on the native engine, recompute on --backend vllm "
                             "(the only mode vLLM honours, docs/vllm.md)")
    pool = parser.add_mutually_exclusive_group()
    pool.add_argument("--kv-device-blocks", type=int, default=None, help="device KV pool size in blocks")
    pool.add_argument("--kv-device-bytes", type=int, default=None, help="device KV pool size in bytes")
    parser.add_argument("--kv-cpu-blocks", type=int, default=env("kv_cpu_blocks", DEFAULT_KV_CPU_BLOCKS))
    parser.add_argument("--max-model-len", type=int, default=env("max_model_len", None),
                        help="longest sequence (prompt + answer) served, at most the model's context (default); "
                             "the device KV pool must hold one such sequence (checked at start-up)")
    parser.add_argument("--block-size", type=int, default=env("block_size", None),
                        help="tokens per KV block (default 16; vllm: 32 on CPU, vLLM's default on CUDA)")
    parser.add_argument("--token-budget", type=int, default=env("token_budget", None),
                        help=f"most tokens one engine step computes (default {DEFAULT_TOKEN_BUDGET}; "
                             f"{DEFAULT_CUDA_TOKEN_BUDGET} on CUDA)")
    parser.add_argument("--step-time-target-ms", type=step_time_target_arg,
                        default=env("step_time_target_ms", str(DEFAULT_STEP_TIME_TARGET_MS)),
                        help=f"native engine: each step's token budget is what the cost model, refit from "
                             f"measured steps, says fits this many ms, --token-budget the cap, so a cancel or a "
                             f"new request waits at most one short step (default {DEFAULT_STEP_TIME_TARGET_MS:g}); "
                             f"off: every step gets --token-budget")
    parser.add_argument("--max-running", type=int, default=env("max_running", DEFAULT_MAX_RUNNING))
    add_speculative_args(parser, env)
    parser.add_argument("--lcas-starvation-s", type=float, default=env("lcas_starvation_s", None),
                        help="lcas: a request passed over for longer than this jumps ahead "
                             "(default: the policy's, 5 s)")
    parser.add_argument("--max-streams", type=int, default=env("max_streams", DEFAULT_MAX_STREAMS),
                        help="open StreamPrompt/Generate calls allowed at once")
    parser.add_argument("--max-sessions", type=int, default=env("max_sessions", DEFAULT_MAX_SESSIONS),
                        help="open sessions (the Sessions service) allowed at once")
    parser.add_argument("--backend", default=env("backend", DEFAULT_BACKEND), choices=BACKEND_CHOICES,
                        help="native (default) or vllm (needs the vllm extra, see docs/vllm.md)")
    parser.add_argument("--role", default=env("role", DEFAULT_ROLE), choices=ROLE_CHOICES,
                        help="what the router uses this replica for: both (default), prefill or decode "
                             "(disaggregated serving, docs/disagg.md; native backend)")
    parser.add_argument("--log-level", default=env("log_level", "INFO"))
    add_tls_args(parser, "inference")


def add_speculative_args(parser: argparse.ArgumentParser, env=lambda key, default: default) -> None:
    """How much prefill of prompts still receiving context a step may hold (the scheduler's two tiers)."""
    parser.add_argument("--speculative-share", type=speculative_share_arg,
                        default=env("speculative_share", str(DEFAULT_SPECULATIVE_SHARE)),
                        help=f"most of the token budget prompts still receiving context may use per step "
                             f"(default {DEFAULT_SPECULATIVE_SHARE}); off: no tiers, the policy's order alone")
    parser.add_argument("--speculative-reserve-share", type=float,
                        default=env("speculative_reserve_share", DEFAULT_SPECULATIVE_RESERVE_SHARE),
                        help=f"share of the token budget those prompts keep while complete ones saturate it "
                             f"(default {DEFAULT_SPECULATIVE_RESERVE_SHARE})")
    parser.add_argument("--speculative-append-share", type=share_arg,
                        default=env("speculative_append_share", DEFAULT_SPECULATIVE_APPEND_SHARE),
                        help=f"most of the token budget append-mode prompts still receiving context may use per "
                             f"step (default {DEFAULT_SPECULATIVE_APPEND_SHARE}); --speculative-share bounds "
                             f"update-mode prompts, whose prefill ahead a refinement may replace")
    parser.add_argument("--kv-reuse", choices=KV_REUSE_CHOICES, default=env("kv_reuse", DEFAULT_KV_REUSE),
                        help=f"native engine: KV reuse of requests that name none (default {DEFAULT_KV_REUSE}); "
                             "blend reuses cached retrieved passages at new positions, approximately")
    parser.add_argument("--chunk-store-fill", choices=CHUNK_STORE_FILL_CHOICES,
                        default=env("chunk_store_fill", DEFAULT_CHUNK_STORE_FILL),
                        help=f"native engine: which requests fill the chunk store with the passages they prefill "
                             f"(default {DEFAULT_CHUNK_STORE_FILL}: only blend-mode ones; all: exact-mode ones too, "
                             f"for later blend requests)")
    parser.add_argument("--blend-recompute", type=blend_recompute_arg,
                        default=env("blend_recompute", str(DEFAULT_BLEND_RECOMPUTE)),
                        help=f"native engine, blend: share of a reused passage's tokens recomputed, in [0, 1] "
                             f"(default {DEFAULT_BLEND_RECOMPUTE})")
