"""A real Prometheus (Debian's `prometheus`) scrapes two native replicas under load, and the query a
KEDA trigger written for vLLM uses, `sum(vllm:num_requests_waiting)`, returns their queue."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import grpc
import pytest

from protos import common_pb2, inference_pb2
from tests.support.inference import RunningInference
from tests.support.redis_server import free_port

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="needs Prometheus (Debian package `prometheus`; scripts/setup.sh installs it)")]
QUERY = "sum(vllm:num_requests_waiting)"
QUEUED_PER_REPLICA = 2


def prompt(topic: str) -> list[common_pb2.Segment]:
    return [common_pb2.Segment(text=f"<|im_start|>user\nTell me about {topic}.<|im_end|>\n<|im_start|>assistant\n")]


def query(port: int) -> float | None:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": QUERY})
    body = json.load(urllib.request.urlopen(url, timeout=10))
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def until(condition, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.2)


@pytest.fixture
def prometheus_over(tmp_path):
    processes = []

    def start(targets: list[str]) -> int:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                          "  - job_name: inference\n    static_configs:\n"
                          f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
        with open(tmp_path / "prometheus.log", "w") as log:
            processes.append(subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT))

        def ready() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5).status == 200
            except OSError:
                return False
        until(ready, "Prometheus ready")
        return port

    yield start
    for process in processes:
        process.terminate()
        process.wait(30)


def test_prometheus_sums_the_waiting_requests_of_every_replica(embedded_model_dir, prometheus_over):
    # One request runs at a time (max_running=1, first come first served): while a long answer
    # decodes, the requests sent after it wait, a queue that holds still for Prometheus to read.
    replicas = [RunningInference(embedded_model_dir, max_running=1, policy="fcfs", kv_device_blocks=256)
                for _ in range(2)]
    calls: list[grpc.Future] = []
    try:
        port = prometheus_over([f"127.0.0.1:{r.service.runner.metrics_port}" for r in replicas])
        until(lambda: query(port) == 0, "both replicas scraped, nothing waiting")
        long = common_pb2.SamplingParams(max_tokens=4000, ignore_eos=True)
        short = common_pb2.SamplingParams(max_tokens=4)
        for replica in replicas:
            first = replica.stub.Generate(inference_pb2.GenerateRequest(segments=prompt("the sea"), sampling=long),
                                          timeout=600)
            calls.append(first)
            until(lambda first=first: next(first), "the long answer started")
            for i in range(QUEUED_PER_REPLICA):
                calls.append(replica.stub.Generate(inference_pb2.GenerateRequest(
                    segments=prompt(f"topic {i}"), sampling=short), timeout=600))
        until(lambda: all(r.stats().num_waiting == QUEUED_PER_REPLICA for r in replicas), "the replicas' queues")
        assert until(lambda: query(port) == QUEUED_PER_REPLICA * len(replicas),
                     f"{QUERY} = {QUEUED_PER_REPLICA * len(replicas)}")
        for call in calls[::QUEUED_PER_REPLICA + 1]:
            call.cancel()                         # the long answers end: the queues drain
        until(lambda: query(port) == 0, f"{QUERY} back to 0")
    finally:
        for call in calls:
            call.cancel()
        for replica in replicas:
            replica.stop()
