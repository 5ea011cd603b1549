"""The native inference engine: scheduler, KV pools, model runner, sampler.

Importing the engine chooses how Triton runs, once for the process: on a machine with no CUDA
device its kernels (`triton_attention`) run in Triton's interpreter (`TRITON_INTERPRET=1`). Triton
reads that variable as it defines its own `@triton.jit` helpers, so it must be set before anything
first imports triton, which transformers' model classes do too; every user of the kernels imports
this package first. The device is probed without torch (the CLI's parser imports this package and
stays light): NVIDIA's driver device, unless `CUDA_VISIBLE_DEVICES` hides every GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

CUDA_DEVICE_FILES = ("/dev/nvidiactl", "/dev/dxg")   # the NVIDIA driver; WSL's GPU device


def cuda_device_absent() -> bool:
    """No CUDA device can be used here: no driver device, or `CUDA_VISIBLE_DEVICES` hides them all."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return True
    return not any(Path(path).exists() for path in CUDA_DEVICE_FILES)


if cuda_device_absent():
    os.environ.setdefault("TRITON_INTERPRET", "1")
