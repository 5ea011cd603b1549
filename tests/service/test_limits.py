"""The shared limits (`inference_svc.rpc.limits`) and the start-up pool check at the flags' seam
(`inference_svc.server.checked_pool`), for both backends, without starting an engine or vllm. The real
services refusing a small pool and answering the same limits: tests/service/test_backend_parity.py."""

from __future__ import annotations

import argparse

import pytest

from inference_svc.engine.engine import PromptTooLongError
from inference_svc.rpc.limits import ModelShape, PoolTooSmall, PromptLimits, blocks_needed, check_pool_holds_context
from inference_svc.server import checked_pool
from inference_svc.server_args import add_inference_args


def flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_inference_args(parser)
    return parser.parse_args(["--dtype", "float32", *argv])


def refusal(model_dir, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        checked_pool(flags(*argv), model_dir)
    message = str(info.value.code)
    assert "\n" not in message
    return message


def test_a_pool_holding_one_context_passes_and_one_block_less_is_refused_with_a_value_that_works():
    check_pool_holds_context(sequence_tokens=8192, block_size=32, blocks=256)
    check_pool_holds_context(sequence_tokens=8192, block_size=32, blocks=257, reserved_blocks=1)
    with pytest.raises(PoolTooSmall) as info:
        check_pool_holds_context(sequence_tokens=8192, block_size=32, blocks=256, reserved_blocks=1)
    assert str(info.value) == ("--kv-device-blocks 256 holds 8160 tokens in 32-token blocks (1 kept by the backend), "
                               "less than one 8192-token context: use --kv-device-blocks 257 or more, "
                               "or --max-model-len 8160 to serve shorter sequences")
    assert blocks_needed(8192, 32, 1) == 257 and blocks_needed(8193, 32) == 257


def test_a_byte_budget_is_answered_in_bytes():
    with pytest.raises(PoolTooSmall, match=r"^--kv-device-bytes 1000 holds 160 tokens in 16-token blocks, less "
                                           r"than one 8192-token context: use --kv-device-bytes 51200 or more"):
        check_pool_holds_context(sequence_tokens=8192, block_size=16, blocks=10, flag="--kv-device-bytes",
                                 bytes_per_block=100)


@pytest.mark.parametrize(("backend", "works"), [("native", 256), ("vllm", 257)])
def test_the_same_rule_refuses_a_small_pool_at_start_up_on_both_backends(embedded_model_dir, backend, works):
    message = refusal(embedded_model_dir, "--backend", backend, "--block-size", "32", "--kv-device-blocks", "96")
    assert message.startswith("error: --kv-device-blocks 96 holds "), message
    assert f"use --kv-device-blocks {works} or more" in message
    checked_pool(flags("--backend", backend, "--block-size", "32", "--kv-device-blocks", str(works)),
                 embedded_model_dir)


def test_vllm_on_cpu_at_its_default_block_size_needs_257_blocks(embedded_model_dir):
    assert "use --kv-device-blocks 257 or more" in refusal(embedded_model_dir, "--backend", "vllm",
                                                           "--kv-device-blocks", "96")
    checked_pool(flags("--backend", "vllm", "--kv-device-blocks", "66", "--block-size", "128"), embedded_model_dir)


def test_max_model_len_serves_a_small_pool_on_purpose(embedded_model_dir):
    message = refusal(embedded_model_dir, "--kv-device-blocks", "64")          # native, 16-token blocks
    assert "use --kv-device-blocks 512 or more, or --max-model-len 1024" in message
    checked_pool(flags("--kv-device-blocks", "64", "--max-model-len", "1024"), embedded_model_dir)
    assert "--max-model-len sequence" in refusal(embedded_model_dir, "--kv-device-blocks", "64",
                                                 "--max-model-len", "1025")


def test_a_byte_pool_is_checked_in_the_backends_footprint(embedded_model_dir):
    shape = ModelShape.from_model_dir(embedded_model_dir)
    per_block = shape.bytes_per_block(16, "float32")
    message = refusal(embedded_model_dir, "--kv-device-bytes", str(per_block * 100))
    assert f"use --kv-device-bytes {512 * per_block} or more" in message
    checked_pool(flags("--kv-device-bytes", str(per_block * 512)), embedded_model_dir)
    checked_pool(flags(), embedded_model_dir)                                 # the defaults hold a context
    checked_pool(flags("--backend", "vllm"), embedded_model_dir)


def test_a_bad_vllm_block_size_is_refused_by_name_before_the_pool(embedded_model_dir):
    message = refusal(embedded_model_dir, "--backend", "vllm", "--block-size", "48", "--kv-device-blocks", "96")
    assert message.startswith("error: --block-size 48 cannot be honoured on --backend vllm"), message


def test_prompt_limits_leave_room_for_one_token_and_name_both_limits():
    limits = PromptLimits(vocab_size=100, max_model_len=8192, pool_tokens=8160)
    limits.check_fits(8159)
    with pytest.raises(PromptTooLongError) as info:
        limits.check_fits(8160)
    assert str(info.value) == ("prompt too long: 8160 tokens; the limit is 8159 (model context 8192, "
                               "device pool 8160 tokens)")
