"""The vLLM comparison of `bench sessions`: the same warm Generates against a `--backend vllm`
service (its prefix caching), on the contexts the native runs built, when vLLM is installed."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

from load_tests.sessions.client import SessionsClient
from load_tests.sessions.workload import INSTRUCTIONS, QUESTIONS
from servicekit.progress import say


def vllm_prefix_cache(args: argparse.Namespace, model_dir: Path, contexts: dict[tuple[int, int], list[str]],
                      rows: list[dict[str, Any]]) -> str | None:
    """Warm Generate through a `--backend vllm` service on each seed's contexts; adds
    `vllm_prefix_cache_ttft_ms` to `rows`. Returns why it was skipped, or None."""
    python = args.vllm_python
    if args.no_vllm:
        return "--no-vllm"
    if not python or not Path(python).exists():
        return f"no vLLM interpreter ({python or '/opt/vllm-venv/bin/python'} missing)"
    from inference_svc.launch import start_vllm_service

    say(f"starting the vLLM inference service ({python})")
    try:
        service = start_vllm_service(model_dir, dtype=args.resolved_dtype, device=args.device, metrics_port=0,
                                     python=python, timeout_s=900)
    except Exception as exc:        # the baseline is optional: say why it is missing
        return f"the vLLM service did not start: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    client = SessionsClient(service.address)
    try:
        for row in rows:
            rng = random.Random(f"vllm-{row['seed']}-{row['point']}")
            data = contexts[(row["seed"], row["point"])]
            tag = f"[vllm {row['seed']}-{row['point']}-{time.time_ns()}] "
            questions = rng.sample(QUESTIONS, args.warm_repeats + 1)
            client.generate(client.segments(tag + INSTRUCTIONS, data, questions[0]))      # fills the cache
            warm = [client.generate(client.segments(tag + INSTRUCTIONS, data, q))[0] for q in questions[1:]]
            row["vllm_prefix_cache_ttft_ms"] = statistics.median(warm)
            say(f"vLLM seed {row['seed']} {row['context_tokens']:>5} tokens: prefix cache "
                 f"{row['vllm_prefix_cache_ttft_ms']:.1f} ms")
    finally:
        client.close()
        service.stop()
    return None
