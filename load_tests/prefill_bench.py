"""Prefill throughput of our runner against transformers' own forward, on the same prompt.

``measure_prefill_tokens_per_s`` is what ``streamrag bench engine`` calls. For each prompt
length it times our runner and transformers' forward (``logits_to_keep=1``, as ``generate``
prefills; chunks go through its ``DynamicCache``), one-shot and in fixed-size chunks, in the
same dtype under ``torch.inference_mode``. Runs are interleaved and the best of ``repeats`` is kept, so a
noisy neighbour on a shared CPU costs both engines alike. Prompt token values do not
change the speed; they are drawn at random.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from inference_svc.engine.model_runner import ChunkInput, ModelRunner
from inference_svc.engine.models import ModelConfig


@dataclass(frozen=True)
class PrefillResult:
    engine: str  # "streamrag" or "transformers"
    prompt_tokens: int
    chunk_tokens: int | None  # None: the whole prompt in one forward
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.prompt_tokens / self.seconds


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_of(fn: Callable[[], object], device: torch.device) -> float:
    """Wall time of ``fn``, the device's queued work included."""
    sync_device(device)
    start = time.perf_counter()
    fn()
    sync_device(device)
    return time.perf_counter() - start


def measure_prefill_tokens_per_s(
    model: str | Path | ModelConfig,
    *,
    prompt_lengths: Sequence[int] = (512, 2048, 4096),
    chunk_tokens: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    repeats: int = 3,
    compare_transformers: bool = True,
    progress: Callable[[str], None] | None = print,
) -> list[PrefillResult]:
    """Best-of-``repeats`` prefill times for each prompt length; one result per engine and mode.

    ``model`` is a Hugging Face directory, or a ``ModelConfig`` for random weights (e.g.
    ``random_llama_config("llama-3.1-8b")`` on a GPU); transformers is compared only for a directory.
    """
    device = torch.device(device)
    say = progress or (lambda _msg: None)
    block_size = 16
    num_blocks = -(-max(prompt_lengths) // block_size)
    say(f"loading {getattr(model, 'name', model)} ({dtype}, {device})")
    runner = ModelRunner(
        model, device=device, dtype=dtype, block_size=block_size, num_device_blocks=num_blocks, num_cpu_blocks=0
    )
    hf = None
    if compare_transformers and not isinstance(model, ModelConfig):
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    return time_prefill(runner, hf, prompt_lengths=prompt_lengths, chunk_tokens=chunk_tokens, repeats=repeats,
                        progress=progress)


def time_prefill(
    runner: ModelRunner,
    hf: object | None,
    *,
    prompt_lengths: Sequence[int],
    chunk_tokens: int,
    repeats: int = 3,
    progress: Callable[[str], None] | None = print,
) -> list[PrefillResult]:
    """Best-of-``repeats`` prefill times of ``runner`` (its pool must hold the longest prompt) and of the
    transformers model ``hf`` (None: not compared), one shot and in ``chunk_tokens`` chunks, interleaved."""
    device = runner.device
    say = progress or (lambda _msg: None)
    table = list(range(-(-max(prompt_lengths) // runner.block_size)))

    def ours(ids: list[int], chunk: int) -> None:
        for start in range(0, len(ids), chunk):
            piece = ids[start : start + chunk]
            runner.execute([ChunkInput(piece, start, table, want_logits=start + chunk >= len(ids))])

    def theirs(ids: list[int], chunk: int) -> None:
        from transformers import DynamicCache

        with torch.inference_mode():
            cache = DynamicCache(config=hf.config)
            for start in range(0, len(ids), chunk):
                piece = torch.tensor([ids[start : start + chunk]], device=device)
                hf(piece, past_key_values=cache, use_cache=True, logits_to_keep=1)

    gen = torch.Generator().manual_seed(0)
    vocab = runner.config.vocab_size
    warm = torch.randint(0, vocab, (min(prompt_lengths),), generator=gen).tolist()
    ours(warm, len(warm))
    if hf is not None:
        theirs(warm, len(warm))

    results: list[PrefillResult] = []
    for n in prompt_lengths:
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        modes: dict[tuple[str, int | None], Callable[[], None]] = {
            ("streamrag", None): lambda ids=ids: ours(ids, len(ids)),
            ("streamrag", chunk_tokens): lambda ids=ids: ours(ids, chunk_tokens),
        }
        if hf is not None:
            modes[("transformers", None)] = lambda ids=ids: theirs(ids, len(ids))
            modes[("transformers", chunk_tokens)] = lambda ids=ids: theirs(ids, chunk_tokens)
        best = {key: float("inf") for key in modes}
        for r in range(repeats):
            for key, fn in modes.items():
                best[key] = min(best[key], seconds_of(fn, device))
            say(f"prefill {n} tokens: repeat {r + 1}/{repeats}")
        for (engine, chunk), seconds in best.items():
            result = PrefillResult(engine, n, chunk, seconds)
            results.append(result)
            mode = "one-shot" if chunk is None else f"chunks of {chunk}"
            say(f"  {engine:12s} {mode:16s} {result.tokens_per_s:8.0f} tok/s ({seconds:.3f} s)")
    return results


def format_table(results: Sequence[PrefillResult]) -> str:
    """A plain-text table: one row per prompt length, one column per engine and mode."""
    columns = list(dict.fromkeys((r.engine, r.chunk_tokens) for r in results))
    header = ["tokens"] + [f"{e} {'one-shot' if c is None else f'chunk {c}'}" for e, c in columns]
    rows = [header]
    for n in dict.fromkeys(r.prompt_tokens for r in results):
        by_key = {(r.engine, r.chunk_tokens): r for r in results if r.prompt_tokens == n}
        rows.append([str(n)] + [f"{by_key[k].tokens_per_s:.0f}" if k in by_key else "-" for k in columns])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
