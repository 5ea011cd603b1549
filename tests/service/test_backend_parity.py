"""The same hostile inputs get the same answers from both backends (black box, real services).

Each test runs once per backend: `native` in the default suite, `vllm` under the vllm marker
(from the vLLM venv, docs/vllm.md):

    /opt/vllm-venv/bin/python -m pytest --run-vllm -m vllm tests/service/test_backend_parity.py

The expected status, message and counters are written once here, not per backend: many one-token
appends complete (within the call's deadline) and are counted; one-token segments in one Generate
are served up to the limit and 4,000 of them are refused with the same RESOURCE_EXHAUSTED message;
a prompt one token short of the context is served and one at the context is refused alike; a
pool smaller than one context is refused at start-up with one line naming the flag and a value that
works; GetStats counts the same requests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from protos import common_pb2, inference_pb2
from tests.support.inference import RunningInference
from tests.support.inference_calls import append_msg, collect, finish_msg, open_msg, seg, update_msg

REPO = Path(__file__).resolve().parents[2]
CONTEXT = 1024                    # --max-model-len on both services (the rule is the same at the model's 8,192)
LIMIT = CONTEXT - 1               # room for one generated token
HEAD = [seg("<|im_start|>user\nQuestion: how do I read a file in Python?\nDocuments:\n")]
SUFFIX = [seg("<|im_end|>\n<|im_start|>assistant\n")]
BACKENDS = ["native", pytest.param("vllm", marks=pytest.mark.vllm)]
pytestmark = pytest.mark.timeout(900)   # the first test also waits for vLLM's start (minutes on a loaded machine)
VLLM_PYTHON = "/opt/vllm-venv/bin/python"


def ids(n: int, base: int = 100) -> common_pb2.Segment:
    return common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=[(i * 7919) % 40000 + base for i in range(n)]))


def generate(stub, segments, request_id: str, max_tokens: int = 2, timeout: float = 300):
    return collect(stub.Generate(inference_pb2.GenerateRequest(
        request_id=request_id, segments=list(segments), sampling=common_pb2.SamplingParams(max_tokens=max_tokens)),
        timeout=timeout))


def python_for(backend: str) -> str:
    return VLLM_PYTHON if backend == "vllm" else sys.executable


@pytest.fixture(scope="module", params=BACKENDS)
def service(request, embedded_model_dir):
    if request.param == "vllm":
        pytest.importorskip("vllm")
        from tests.support.inference import InferenceProcess

        running = InferenceProcess(embedded_model_dir, backend="vllm", max_streams=16,
                                   extra_args=("--max-model-len", str(CONTEXT)))
    else:
        running = RunningInference(embedded_model_dir, token_budget=2048, policy="fcfs", max_streams=16,
                                   max_model_len=CONTEXT)
    yield running
    running.stop()


def test_many_one_token_appends_complete_and_are_counted(service):
    """500 appends of one token each: the call ends within its deadline (vLLM coalesces the appends
    that arrive while a turn runs into the next turn) and answers as Generate does."""
    pieces = [ids(1, 100 + i) for i in range(500)]
    messages = [open_msg("one-token-appends", HEAD, max_tokens=4), *(append_msg(p) for p in pieces),
                finish_msg(*SUFFIX)]
    streamed = collect(service.stub.StreamPrompt(iter(messages), timeout=120))
    expected = generate(service.stub, HEAD + pieces + SUFFIX, "one-token-appends-reference", max_tokens=4)
    assert streamed.tokens == expected.tokens
    assert (streamed.done.stats.num_appends, streamed.done.stats.num_updates) == (500, 0)
    assert streamed.done.stats.prompt_tokens == expected.done.stats.prompt_tokens
    service.wait_until_all_blocks_free()


def test_one_token_segments_in_generate_are_served_up_to_the_limit(service):
    answer = generate(service.stub, [seg(" x")] * 1000, "a-thousand-segments")
    assert answer.done is not None and answer.done.stats.prompt_tokens == 1000
    with pytest.raises(grpc.RpcError) as info:
        generate(service.stub, [seg(" x")] * 4000, "four-thousand-segments")
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details().startswith(f"prompt too long: 4000 tokens; the limit is {LIMIT} "), info.value.details()
    service.wait_until_all_blocks_free()


@pytest.mark.parametrize("via", ["generate", "appends"])
def test_a_prompt_one_short_of_the_context_is_served_and_one_more_is_refused(service, via):
    def send(n: int, request_id: str):
        if via == "generate":
            return generate(service.stub, [ids(n)], request_id)
        parts = [ids(250, 100 + k) for k in range(4)] + [ids(n - 1000, 7)]
        messages = [open_msg(request_id, [], max_tokens=2), *(append_msg(p) for p in parts[:-1]),
                    finish_msg(parts[-1])]
        return collect(service.stub.StreamPrompt(iter(messages), timeout=300))

    served = send(LIMIT, f"near-context-{via}")
    assert served.done is not None and served.done.stats.prompt_tokens == LIMIT
    assert served.done.finish_reason == common_pb2.FINISH_REASON_LENGTH   # one token fits, no more
    with pytest.raises(grpc.RpcError) as info:
        send(CONTEXT, f"at-context-{via}")
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details().startswith(f"prompt too long: {CONTEXT} tokens; the limit is {LIMIT} (model context "
                                           f"{CONTEXT}, device pool "), info.value.details()
    service.wait_until_all_blocks_free()


def test_get_stats_counts_requests_and_done_counts_messages_alike(service):
    # An earlier test's cancelled call is aborted at the engine's next step: let it land first, or it
    # would count here (an abort and its finish).
    before = service.wait_until_all_blocks_free().counters
    answer = collect(service.stub.StreamPrompt(iter([
        open_msg("counted", HEAD, max_tokens=2), append_msg(seg(" doc one")), append_msg(seg(" doc two")),
        update_msg(seg(" doc three")), finish_msg(*SUFFIX)]), timeout=120))
    generate(service.stub, HEAD + SUFFIX, "counted-generate")
    with pytest.raises(grpc.RpcError):
        generate(service.stub, [ids(CONTEXT)], "counted-refused")
    service.wait_until_all_blocks_free()
    after = service.stats().counters
    assert (answer.done.stats.num_appends, answer.done.stats.num_updates) == (2, 1)
    delta = {name: getattr(after, name) - getattr(before, name)
             for name in ("requests_received", "requests_finished", "requests_aborted")}
    assert delta == {"requests_received": 2, "requests_finished": 2, "requests_aborted": 0}


# --- start-up -----------------------------------------------------------------------------------
def serve(backend: str, model_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([python_for(backend), "-m", "streamrag.cli", "serve", "inference", "--backend", backend,
                           "--port", "0", "--metrics-port", "0", "--model", str(model_dir), "--dtype", "float32",
                           *flags], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pool_smaller_than_one_context_is_refused_at_start_up_by_name(backend, embedded_model_dir):
    """--kv-device-blocks 96 at 32-token blocks holds 3,072 tokens, not one 8,192-token context: the
    service exits at once (before any engine starts) with one line naming the flag and a value that
    works (vLLM keeps one block back, so it needs one block more)."""
    if backend == "vllm" and not Path(VLLM_PYTHON).exists():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON}")
    result = serve(backend, embedded_model_dir, "--block-size", "32", "--kv-device-blocks", "96")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    works = 256 + (1 if backend == "vllm" else 0)
    assert lines[0].startswith("error: --kv-device-blocks 96 holds "), lines[0]
    assert f"use --kv-device-blocks {works} or more" in lines[0], lines[0]
    assert "--max-model-len" in lines[0]
