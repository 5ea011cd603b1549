"""Flags of `streamrag serve inference` (kept free of heavy imports so `--help` is instant).

The choice lists mirror the engine's registries; tests/service/test_inference_cli.py
checks that they agree.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from servicekit.config import add_service_args, env_default

DTYPE_CHOICES = ["bfloat16", "float32", "float16"]
POLICY_CHOICES = ["default", "fcfs", "lcas", "mcps", "klpm"]
EVICTION_CHOICES = ["recompute", "swap", "cost"]
BACKEND_CHOICES = ["native", "vllm"]


def add_inference_args(parser: argparse.ArgumentParser) -> None:
    add_service_args(parser, "inference")
    env = lambda key, default: env_default("inference", key, default)  # noqa: E731
    parser.add_argument("--model", type=Path, default=env("model", None),
                        help="Hugging Face model directory (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default=env("device", "cpu"), help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default=env("dtype", "bfloat16"), choices=DTYPE_CHOICES)
    parser.add_argument("--policy", default=env("policy", "fcfs"), choices=POLICY_CHOICES)
    parser.add_argument("--eviction", default=env("eviction", "cost"), choices=EVICTION_CHOICES)
    pool = parser.add_mutually_exclusive_group()
    pool.add_argument("--kv-device-blocks", type=int, default=None, help="device KV pool size in blocks")
    pool.add_argument("--kv-device-bytes", type=int, default=None, help="device KV pool size in bytes")
    parser.add_argument("--kv-cpu-blocks", type=int, default=env("kv_cpu_blocks", 2048))
    parser.add_argument("--block-size", type=int, default=env("block_size", None),
                        help="tokens per KV block (default 16; vllm: its platform default, 128 on CPU)")
    parser.add_argument("--token-budget", type=int, default=env("token_budget", 2048))
    parser.add_argument("--max-running", type=int, default=env("max_running", 256))
    parser.add_argument("--max-streams", type=int, default=env("max_streams", 256),
                        help="open StreamPrompt/Generate calls allowed at once")
    parser.add_argument("--backend", default=env("backend", "native"), choices=BACKEND_CHOICES,
                        help="native (default) or vllm (needs the vllm extra, see docs/vllm.md)")
    parser.add_argument("--log-level", default=env("log_level", "INFO"))
