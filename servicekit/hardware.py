"""Which number format is fast on this machine (torch-free: reads /proc/cpuinfo).

bfloat16 halves the bytes read per step, but a CPU only computes it fast with native
support (AVX512-BF16 or AMX). Without it PyTorch emulates bf16 matmuls: on an AVX2-only
AMD EPYC here a 512x576 @ 576x1536 matmul took 2,051 ms in bf16 against 55 ms in fp32.
So `auto`, the default dtype everywhere, is bfloat16 on CUDA and on CPUs with native bf16,
float32 on every other CPU.
"""

from __future__ import annotations

import functools
from pathlib import Path

AUTO = "auto"
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_has_fast_bf16() -> bool:
    return bool(BF16_CPU_FLAGS & cpu_flags())


def cpu_kind() -> str:
    """The CPU kind results are reported by: "AMX", "AVX512-BF16" or "AVX2"."""
    flags = cpu_flags()
    return "AMX" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else "AVX2"


def resolve_dtype(name: str, device: str = "cpu") -> str:
    """`auto` → "bfloat16" where it is fast (CUDA, CPUs with native bf16), else "float32";
    any other name is returned unchanged."""
    if name != AUTO:
        return name
    if not device.startswith("cpu"):
        return "bfloat16"
    return "bfloat16" if cpu_has_fast_bf16() else "float32"
