"""`streamrag profile`: measure recompute (prefill) and swap latency on this device and model.

Prefill latency is measured over token counts, swap latency (one direction, device<->CPU)
over block counts. Each size runs once untimed first (the first call at a size pays one-time
allocation costs), then each point is the median of the timed repeats. The JSON it writes is what
the engine's `CostModel.load` reads, stored per device, model and dtype under the cache directory
(`scripts/setup.sh` runs it once). Torch loads when the command runs, not when its flags are built.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DTYPE_CHOICES

if TYPE_CHECKING:
    import torch

DEFAULT_TOKENS = (16, 64, 256, 512, 1024, 2048, 4096)
DEFAULT_BLOCKS = (1, 8, 32, 128, 512)


def add_profile_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--device", default=DEFAULT_DEVICE, help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="prefill sizes to measure")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="profile JSON (default: the cache's profile path)")


def run_profile(args: argparse.Namespace) -> int:
    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.cost_model import profile_path
    from inference_svc.engine.factory import DTYPES, device_kind
    from servicekit.config import default_cache_dir
    from servicekit.hardware import resolve_dtype

    model_dir = args.model or prepare_embedded_model(progress=False)
    dtype = resolve_dtype(args.dtype, args.device)
    tokens = [int(t) for t in args.tokens.split(",")]
    profile = measure_profile(model_dir, device=args.device, dtype=DTYPES[dtype], token_counts=tokens,
                              repeats=args.repeats, say=lambda m: print(m, file=sys.stderr, flush=True))
    out = args.out or profile_path(default_cache_dir(), device_kind(args.device), Path(model_dir).name, dtype)
    print(write_profile(profile, Path(out)))
    return 0


def _timed_ms(fn: Callable[[], object], device: torch.device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - started) * 1e3


def measure_profile(model_dir: Path, *, device: str = "cpu", dtype: torch.dtype | None = None,
                    block_size: int = 16, token_counts: Sequence[int] = DEFAULT_TOKENS,
                    block_counts: Sequence[int] = DEFAULT_BLOCKS, repeats: int = 3,
                    say: Callable[[str], None] = print) -> dict:
    """The profile as `write_profile` stores it; `dtype` default bfloat16."""
    import torch

    from inference_svc.engine.model_runner import ChunkInput, ModelRunner

    dtype = dtype or torch.bfloat16
    say(f"loading {model_dir} on {device} ({dtype})")
    max_tokens = max(token_counts)
    blocks = max(-(-max_tokens // block_size), max(block_counts))
    runner = ModelRunner(model_dir, device=device, dtype=dtype, block_size=block_size,
                         num_device_blocks=blocks, num_cpu_blocks=max(block_counts))
    token_counts = [t for t in token_counts if t < runner.config.max_position_embeddings]
    dev = runner.device
    gen = torch.Generator().manual_seed(0)
    table = list(range(blocks))
    warm = torch.randint(0, runner.config.vocab_size, (64,), generator=gen).tolist()
    runner.execute([ChunkInput(warm, 0, table, True)])

    recompute: list[list[float]] = []
    for i, tokens in enumerate(token_counts, 1):
        ids = torch.randint(0, runner.config.vocab_size, (tokens,), generator=gen).tolist()
        runner.execute([ChunkInput(ids, 0, table, True)])          # warm-up at this size, untimed
        times = [_timed_ms(lambda ids=ids: runner.execute([ChunkInput(ids, 0, table, True)]), dev)
                 for _ in range(repeats)]
        recompute.append([tokens, statistics.median(times)])
        say(f"[recompute {i}/{len(token_counts)}] {tokens:6d} tokens: {recompute[-1][1]:9.2f} ms")

    swap: list[list[float]] = []
    for i, count in enumerate(block_counts, 1):
        pairs = [(b, b) for b in range(count)]
        runner.swap_out(pairs)                                      # warm-up, untimed
        runner.swap_in(pairs)
        times = []
        for _ in range(repeats):
            times.append(_timed_ms(lambda pairs=pairs: runner.swap_out(pairs), dev))
            times.append(_timed_ms(lambda pairs=pairs: runner.swap_in(pairs), dev))
        swap.append([count, statistics.median(times)])
        say(f"[swap {i}/{len(block_counts)}] {count:6d} blocks: {swap[-1][1]:9.3f} ms per direction")

    return {
        "device": str(dev), "model": Path(model_dir).name, "dtype": str(dtype).removeprefix("torch."),
        "block_size": block_size, "bytes_per_block": runner.bytes_per_block,
        "created_unix": int(time.time()), "recompute_ms": recompute, "swap_ms": swap,
    }


def write_profile(profile: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile, indent=2))
    tmp.replace(path)
    return path
