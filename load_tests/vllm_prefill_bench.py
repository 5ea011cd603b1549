"""vLLM's prefill speed on the same prompts as `load_tests.prefill_bench` (for
`streamrag bench engine`).

Same random prompts (the same generator seed and draw order), same dtype, one request at a time
with prefix caching off and a token budget that holds the longest prompt, so each prompt is one
forward pass. The time is the wall clock of `LLM.generate` for one token: the prefill plus
vLLM's per-request overhead (input processing, the engine-core round trip, sampling one token).
Best of `repeats`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from inference_svc.vllm_backend.config import VllmSpec, prepare_environment
from load_tests.prefill_bench import PrefillResult


def same_prompts(vocab: int, prompt_lengths: Sequence[int]) -> tuple[list[int], dict[int, list[int]]]:
    """The warm-up prompt and the measured prompts `measure_prefill_tokens_per_s` draws."""
    gen = torch.Generator().manual_seed(0)
    warm = torch.randint(0, vocab, (min(prompt_lengths),), generator=gen).tolist()
    return warm, {n: torch.randint(0, vocab, (n,), generator=gen).tolist() for n in prompt_lengths}


def measure_vllm_prefill(model_dir: Path, prompt_lengths: Sequence[int], dtype: str = "bfloat16",
                         device: str = "cpu", repeats: int = 3,
                         progress: Callable[[str], None] = print) -> list[PrefillResult]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    longest = max(prompt_lengths)
    spec = VllmSpec(model_dir=Path(model_dir), device=device, dtype=dtype)
    prepare_environment(spec)
    progress(f"loading {model_dir} in vLLM ({dtype}, {device})")
    llm = LLM(model=str(model_dir), dtype=dtype, enforce_eager=True, enable_prefix_caching=False, seed=0,
              max_num_batched_tokens=max(longest, 2048), max_model_len=max(longest + 16, 2048))
    try:
        vocab = llm.llm_engine.model_config.get_vocab_size()
        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        warm, prompts = same_prompts(vocab, prompt_lengths)

        def once(ids: list[int]) -> float:
            start = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
            return time.perf_counter() - start

        once(warm)
        results = []
        for n, ids in prompts.items():
            best = min(once(ids) for _ in range(repeats))
            results.append(PrefillResult("vllm", n, None, best))
            progress(f"  vllm         one-shot         {n / best:8.0f} tok/s ({best:.3f} s)")
        return results
    finally:
        llm.llm_engine.engine_core.shutdown()
