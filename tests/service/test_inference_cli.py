"""`streamrag serve inference` as a user runs it: a process that serves health, reflection,
Describe and Prometheus metrics, and stops cleanly on SIGTERM."""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference_svc.engine.factory import DTYPES
from inference_svc.engine.policies import POLICIES
from inference_svc.engine.scheduler import EVICTION_MODES
from inference_svc.server_args import DTYPE_CHOICES, EVICTION_CHOICES, POLICY_CHOICES, add_inference_args
from protos import common_pb2, inference_pb2, inference_pb2_grpc

REPO = Path(__file__).resolve().parents[2]


def test_flag_choices_match_the_engine():
    assert tuple(POLICIES) == POLICY_CHOICES
    assert tuple(EVICTION_MODES) == EVICTION_CHOICES
    assert (*DTYPES, "auto") == (*DTYPE_CHOICES[1:], "auto") and DTYPE_CHOICES[0] == "auto"


def test_serve_inference_command_serves_and_stops_on_sigterm(embedded_model_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrag.cli", "serve", "inference", "--port", "0", "--metrics-port", "0",
         "--model", str(embedded_model_dir), "--policy", "lcas", "--kv-device-blocks", "64", "--kv-cpu-blocks", "64",
         "--max-model-len", "1024"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"on 127\.0\.0\.1:(\d+) \(metrics :(\d+)\)", line)
        assert match, line + proc.stderr.read()
        port, metrics_port = match.groups()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            stub = inference_pb2_grpc.InferenceStub(channel)
            info = stub.Describe(inference_pb2.DescribeRequest(), timeout=10).model_info
            assert (info.policy, info.backend, info.block_size) == ("lcas", "native", 16)
            assert info.chat_format.assistant_prefix == "<|im_start|>assistant\n"
            prompt = (info.chat_format.prompt_prefix + info.chat_format.user_prefix + "What is the capital of France?"
                      + info.chat_format.user_suffix + info.chat_format.assistant_prefix)
            events = list(stub.Generate(inference_pb2.GenerateRequest(
                segments=[common_pb2.Segment(text=prompt)], sampling=common_pb2.SamplingParams(max_tokens=12)),
                timeout=120))
            assert "Paris" in events[-1].event.done.text
            pools = {p.name: p for p in stub.GetStats(inference_pb2.GetStatsRequest(), timeout=10).stats.pools}
            assert pools["device"].total_blocks == 64 and pools["cpu"].total_blocks == 64
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        for name in ("streamrag_ttft_seconds_bucket", "streamrag_engine_step_seconds_count", "streamrag_kv_blocks",
                     "streamrag_requests", "streamrag_preemptions", "streamrag_tokens_invalidated",
                     "streamrag_prefix_cache_hit_tokens"):
            assert name in metrics, name
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_serve_inference_rejects_a_bad_model_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "streamrag.cli", "serve", "inference", "--model", str(tmp_path),
                           "--port", "0", "--metrics-port", "-1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "not a model directory" in proc.stderr and "Traceback" not in proc.stderr


def test_speculative_flags_parse_off_and_reject_nonsense():
    parser = argparse.ArgumentParser()
    add_inference_args(parser)
    assert parser.parse_args([]).speculative_share == 0.5
    assert parser.parse_args(["--speculative-share", "off"]).speculative_share is None
    args = parser.parse_args(["--speculative-share", "0.25", "--speculative-reserve-share", "0.125"])
    assert (args.speculative_share, args.speculative_reserve_share) == (0.25, 0.125)
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-share", "0"])
    assert parser.parse_args([]).speculative_append_share == 1.0
    assert parser.parse_args(["--speculative-append-share", "0.5"]).speculative_append_share == 0.5
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-append-share", "1.5"])
