"""Build a ready engine from a model directory: runner, tokenizer, KV pools, cost profile.

Pool sizes are given in blocks or bytes (bytes are turned into blocks with the model's
per-block footprint). The cost model comes from the profile `streamrag profile` wrote for
this device, model and dtype; without one, a built-in estimate is used and a warning logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from inference_svc.engine.cost_model import CostModel, profile_path
from inference_svc.engine.engine import Engine, EngineConfig
from inference_svc.engine.kv_cache import kv_bytes_per_block, num_blocks_for_bytes
from inference_svc.engine.model_runner import ModelRunner
from inference_svc.engine.models import load_config
from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DEFAULT_KV_CPU_BLOCKS, DTYPE_CHOICES
from inference_svc.engine.tokenization import SegmentTokenizer
from servicekit.config import default_cache_dir
from servicekit.hardware import AUTO, resolve_dtype

log = logging.getLogger(__name__)

DEFAULT_KV_DEVICE_BYTES = 512 * 1024 * 1024
DTYPES = {name: getattr(torch, name) for name in DTYPE_CHOICES if name != AUTO}


@dataclass(frozen=True)
class EngineSpec:
    model_dir: Path
    device: str = DEFAULT_DEVICE
    dtype: str = DEFAULT_DTYPE
    kv_device_blocks: int | None = None
    kv_device_bytes: int | None = None       # used when kv_device_blocks is None
    kv_cpu_blocks: int = DEFAULT_KV_CPU_BLOCKS
    engine: EngineConfig = field(default_factory=EngineConfig)
    profile: Path | None = None              # default: the cache's profile for device/model/dtype

    def __post_init__(self) -> None:         # "auto" becomes the concrete dtype for this device
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype, self.device))


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def device_kind(device: str) -> str:
    """A profile key: 'cpu', or the CUDA device's name."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev).replace(" ", "-")
    return dev.type


def load_cost_model(spec: EngineSpec) -> CostModel:
    path = spec.profile or profile_path(default_cache_dir(), device_kind(spec.device), spec.model_dir.name, spec.dtype)
    if Path(path).exists():
        expected = {"model": spec.model_dir.name, "dtype": spec.dtype, "block_size": spec.engine.block_size}
        return CostModel.load_checked(Path(path), expected, log.warning)
    log.warning("no cost profile at %s (run `streamrag profile`); using the built-in estimate", path)
    return CostModel.builtin()


def build_engine(spec: EngineSpec) -> Engine:
    if spec.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {spec.dtype!r}")
    block_size = spec.engine.block_size
    device_blocks = spec.kv_device_blocks
    if device_blocks is None:
        per_block = kv_bytes_per_block(load_config(spec.model_dir), block_size, DTYPES[spec.dtype])
        device_blocks = num_blocks_for_bytes(spec.kv_device_bytes or DEFAULT_KV_DEVICE_BYTES, per_block)
    if device_blocks < 1:
        raise ValueError("the device KV pool must hold at least one block")
    runner = ModelRunner(spec.model_dir, device=spec.device, dtype=DTYPES[spec.dtype], block_size=block_size,
                         num_device_blocks=device_blocks, num_cpu_blocks=spec.kv_cpu_blocks)
    config = replace(spec.engine, num_device_blocks=device_blocks, num_cpu_blocks=spec.kv_cpu_blocks)
    return Engine(runner, SegmentTokenizer(load_tokenizer(spec.model_dir)), config, load_cost_model(spec))
