"""The engine's choice lists and defaults, written once.

Torch-free, so argparse (`streamrag serve inference`, `up`, `bench replay`) imports it
without loading the engine, and the engine's own dataclasses (`EngineConfig`,
`SchedulerConfig`, `EngineSpec`) and the vLLM backend's `VllmSpec` take their defaults from
here. tests/service/test_inference_cli.py checks that `POLICY_CHOICES` names exactly the
policies in `policies.POLICIES`. The service's own defaults (backend, open calls and sessions)
are in `inference_svc.options`.
"""

from __future__ import annotations

import re

DTYPE_CHOICES = ("auto", "bfloat16", "float32", "float16")
POLICY_CHOICES = ("default", "fcfs", "lcas", "mcps", "klpm")
EVICTION_CHOICES = ("recompute", "swap", "cost")

DEFAULT_DEVICE = "cpu"
DEFAULT_DTYPE = "auto"              # bfloat16 on CUDA and CPUs with native bf16, else float32 (servicekit.hardware)
DEFAULT_POLICY = "fcfs"             # complete prompts first, then partial ones (streaming-aware)
DEFAULT_EVICTION = "cost"           # recompute or swap, whichever the cost model says is cheaper
DEFAULT_BLOCK_SIZE = 16             # tokens per KV block (native engine)
# Attention: "auto" runs the Triton kernels on CUDA (triton_attention.py) and SDPA on a CPU (attention.py).
ATTENTION_CHOICES = ("auto", "sdpa", "triton")
DEFAULT_TOKEN_BUDGET = 2048         # tokens per engine step (prefill chunks + decodes)
# On a GPU a step's cost is mostly fixed until thousands of tokens (an 8B model prefills about 30k tokens/s
# on an H100/H200), so a larger cap lets chunked prefill keep pace with documents arriving quickly; the
# step-time target below still bounds each step.
DEFAULT_CUDA_TOKEN_BUDGET = 8192


def default_token_budget(device: str) -> int:
    """The service's token budget when none is given: larger on a GPU."""
    return DEFAULT_CUDA_TOKEN_BUDGET if str(device).startswith("cuda") else DEFAULT_TOKEN_BUDGET
DEFAULT_MAX_RUNNING = 256           # requests holding KV at once
# Steps bounded in time (step_budget.py): each step's token budget is what the cost model, refit from
# measured steps, says fits this many ms (DEFAULT_TOKEN_BUDGET stays the cap), so a cancel or a new
# arrival waits at most one short step. The service's default; an `EngineConfig` built directly has
# it off (None) unless asked.
DEFAULT_STEP_TIME_TARGET_MS = 250.0
# Speculative prefill (of prompts still receiving context) per step, as shares of the token budget:
# at most this share of prefill that a refinement may replace (update mode, or session ingestion), so a
# prompt that becomes complete waits behind at most half a step of it ...
DEFAULT_SPECULATIVE_SHARE = 0.5
# ... and at most this share of prefill of append-mode prompts, which no refinement replaces: done ahead,
# it is work the prompt needs anyway (the crawler's tail gained from 1.0 and ANNS's lost: docs/results.md,
# "Streaming against not streaming") ...
DEFAULT_SPECULATIVE_APPEND_SHARE = 1.0
# ... and at least this share while complete prompts saturate the budget, so partial prompts still progress.
DEFAULT_SPECULATIVE_RESERVE_SHARE = 0.0625


def share_arg(text: str) -> float:
    """argparse type of a share of the token budget: a number in (0, 1]."""
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError("a share of the token budget must be in (0, 1]")
    return value


def step_time_target_arg(text: str) -> float | None:
    """argparse type of --step-time-target-ms: a positive number of ms, or "off" (the fixed token budget)."""
    if text == "off":
        return None
    value = float(text)
    if not value > 0:
        raise ValueError("the step-time target must be a positive number of ms, or off")
    return value


def speculative_share_arg(text: str) -> float | None:
    """argparse type of --speculative-share: a share of the budget in (0, 1], or "off" (one tier, the
    policy's order alone)."""
    return None if text == "off" else share_arg(text)


# Speculative decoding drafted from the request's own tokens (speculation.py): "off", "auto" (depth
# adapted per request from its acceptance and the engine's load) or a fixed depth k in
# [0, MAX_SPECULATION_DEPTH] ("0" is off). Default auto, from the decode benchmark (docs/results.md):
# on RAG answers it was 1.1-3.1x off at concurrency 1, 4 and 16; on text that does not quote,
# 0.93-1.18x (median 0.97-1.13x), where fixed k = 8 fell to 0.73x under load. No fixed k did both.
SPECULATION_MODES = ("off", "auto")
MAX_SPECULATION_DEPTH = 16
DEFAULT_SPECULATION = "auto"
DEFAULT_DRAFT_BUDGET = 128          # most draft tokens per engine step that auto-depth requests share


def parse_speculation(text: str) -> int | None:
    """The depth a speculation setting asks for: 0 (off), a fixed k, or None (auto). Raises
    ValueError on an unknown mode or a k outside [0, MAX_SPECULATION_DEPTH]."""
    if text == "auto":
        return None
    if text == "off":
        return 0
    if not isinstance(text, str) or not re.fullmatch(r"-?[0-9]{1,9}", text):
        raise ValueError(f"speculation must be off, auto or a depth 0..{MAX_SPECULATION_DEPTH}, got {text!r}")
    depth = int(text)
    if not 0 <= depth <= MAX_SPECULATION_DEPTH:
        raise ValueError(f"speculation depth must be in [0, {MAX_SPECULATION_DEPTH}], got {depth}")
    return depth


def speculation_arg(text: str) -> str:
    """argparse type of --speculation: checked by `parse_speculation`, kept as given."""
    parse_speculation(text)
    return text


DEFAULT_KV_CPU_BLOCKS = 2048        # the swap pool


# KV reuse across requests and refinements (chunk_store.py, blend.py): "exact" reuses only an
# identical prefix (the output is the model's own); "blend" reuses a cached retrieved passage at any
# position, its keys re-rotated and the most deviating `blend_recompute` share of its tokens
# recomputed (CacheBlend's way; the output may differ from exact). Default exact.
KV_REUSE_CHOICES = ("exact", "blend")
DEFAULT_KV_REUSE = "exact"
DEFAULT_BLEND_RECOMPUTE = 0.15      # CacheBlend's default share
# Which requests fill the chunk store with the passages they prefill: "blend" (only blend-mode
# requests: an exact-mode request holds no store block, so exact serving is unchanged) or "all"
# (exact-mode requests too: their passages' KV, computed exactly, serves later blend requests; the
# copies and the store's blocks are then shared by every request).
CHUNK_STORE_FILL_CHOICES = ("blend", "all")
DEFAULT_CHUNK_STORE_FILL = "blend"


def check_kv_reuse(mode: str, fraction: float | None) -> None:
    """Raise ValueError on a KV reuse mode outside KV_REUSE_CHOICES ("" is the default) or a
    recompute share outside [0, 1] (None is the default)."""
    if mode and mode not in KV_REUSE_CHOICES:
        raise ValueError(f"kv_reuse must be one of {', '.join(KV_REUSE_CHOICES)}, got {mode!r}")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                 or not 0.0 <= fraction <= 1.0):   # NaN fails the comparison too
        raise ValueError(f"blend_recompute must be a number in [0, 1], got {fraction!r}")


def blend_recompute_arg(text: str) -> float:
    """argparse type of --blend-recompute: a share in [0, 1]."""
    value = float(text)
    check_kv_reuse("", value)
    return value
