"""A native replica's `/metrics` speaks vLLM's names too (inference_svc/native/vllm_metrics.py):
scraped over HTTP from a live replica under a few requests, every name is there, labelled as
vLLM labels it, and moves."""

from __future__ import annotations

import threading
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from protos import common_pb2, inference_pb2
from tests.support.inference import RunningInference

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
# As vLLM declares them; prometheus_client exposes each counter's samples with `_total`.
COUNTERS = ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions", "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits", "vllm:request_success")
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds")
TOPICS = ("lighthouses", "volcanoes", "glaciers", "coral reefs")


# What Prometheus 2.x asks for: OpenMetrics first, with no escaping scheme named.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
                     "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


def scrape(port: int, accept: str = PROMETHEUS_ACCEPT) -> tuple[str, dict[str, tuple[str, dict[str, float], set]]]:
    """The exposition text, and per family: its type, each sample name's sum, and its label sets."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    text = urllib.request.urlopen(request, timeout=30).read().decode()
    families = {}
    for family in text_string_to_metric_families(text):
        sums: dict[str, float] = {}
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
        families[family.name] = (family.type, sums,
                                 {frozenset(s.labels) for s in family.samples if not s.name.endswith("_bucket")})
    return text, families


def generate(replica: RunningInference, topic: str, max_tokens: int = 40) -> None:
    prompt = f"<|im_start|>user\nWrite a long essay about {topic}, their history and their future.<|im_end|>\n" \
             "<|im_start|>assistant\n"
    list(replica.stub.Generate(inference_pb2.GenerateRequest(
        segments=[common_pb2.Segment(text=prompt)],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)), timeout=300))


def test_a_native_replica_exposes_vllms_metric_names_and_they_move(embedded_model_dir):
    # A device pool too small for the requests at once: some wait, some are preempted.
    replica = RunningInference(embedded_model_dir, kv_device_blocks=12, kv_cpu_blocks=64, token_budget=32)
    try:
        port = replica.service.runner.metrics_port
        text, before = scrape(port)
        for name in (*GAUGES, *COUNTERS, *HISTOGRAMS):
            assert name in before, f"{name} missing from /metrics"
        assert "\nvllm:num_requests_waiting{" in text      # the colon kept, whatever the scraper asks
        for name in COUNTERS:
            assert f"# TYPE {name}_total counter" in text and f"\n{name}_total{{" in text, name
        kinds = {**dict.fromkeys(GAUGES, "gauge"), **dict.fromkeys(COUNTERS, "counter"),
                 **dict.fromkeys(HISTOGRAMS, "histogram")}
        for name, (kind, _, label_sets) in before.items():
            if name.startswith("vllm:"):     # (and the `_created` series prometheus_client adds to counters)
                keys = {key for labels in label_sets for key in labels}
                assert kind == kinds.get(name, "gauge") and keys >= {"model_name", "engine"}, (name, kind, keys)
        assert f'model_name="{embedded_model_dir.name}"' in text

        peaks = {name: 0.0 for name in GAUGES}
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                _, now = scrape(port)
                for name in GAUGES:
                    peaks[name] = max(peaks[name], now[name][1][name])
                stop.wait(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            load = [threading.Thread(target=generate, args=(replica, topic)) for topic in TOPICS]
            for thread in load:
                thread.start()
            for thread in load:
                thread.join()
            generate(replica, TOPICS[0], 4)
            generate(replica, TOPICS[0], 4)          # the same prompt again: served from the prefix cache
        finally:
            stop.set()
            watcher.join()
        _, after = scrape(port)

        assert peaks["vllm:num_requests_running"] >= 1
        assert peaks["vllm:num_requests_waiting"] >= 1
        assert 0 < peaks["vllm:kv_cache_usage_perc"] <= 1
        assert after["vllm:num_requests_running"][1]["vllm:num_requests_running"] == 0
        for name in COUNTERS:
            sample = f"{name}_total"
            assert after[name][1][sample] > before[name][1].get(sample, 0), f"{name} did not move"
        assert after["vllm:request_success"][1]["vllm:request_success_total"] == len(TOPICS) + 2
        assert after["vllm:generation_tokens"][1]["vllm:generation_tokens_total"] >= 40 * len(TOPICS)
        for name in HISTOGRAMS:
            assert after[name][1][f"{name}_count"] > 0, f"{name} observed nothing"
        assert after["vllm:e2e_request_latency_seconds"][1]["vllm:e2e_request_latency_seconds_count"] == len(TOPICS) + 2
    finally:
        replica.stop()
