"""Every figure's command on docs/results.md runs in the default suite, so a refactor cannot break one unseen.

Each `streamrag bench NAME` behind a figure gets a smoke run through the CLI, as a user types it (a
subprocess of `python -m streamrag.cli`), at a tiny size: a few requests, one seed, into a tmp dir. The JSON
it writes must hold the keys its results summary is refreshed from (`docs/results/*.json`, `refresh`). A
bench whose own test already runs it at a tiny size is named in COVERED with that test. Runs that cannot be
made tiny (they read the whole Python docs, or synthesize every trace of the paper) are marked slow
(`--run-slow`).
No timing is asserted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ROOT / "load_tests" / "quality_questions.jsonl"

# Benches whose own tests run them on a tiny configuration.
COVERED = {
    "concurrent": "tests/load_tests/test_concurrent_bench.py",
    "sessions": "tests/load_tests/test_sessions_bench.py",
    "quality": "tests/load_tests/test_quality.py",
    "relevance": "tests/load_tests/test_relevance_calibration.py",
    "retrieval": "tests/load_tests/test_retrieval_bench.py",
    "gpu": "tests/load_tests/test_gpu_bench.py",
    "gpu-replay": "tests/load_tests/test_gpu_replay.py",
    "report": "tests/load_tests/test_results_page.py",
    "chaos": "tests/test_chaos.py",                     # slow: two minutes of a soak on a stack it starts
}


@dataclass(frozen=True)
class Figure:
    bench: str                       # the NAME of `streamrag bench NAME`
    argv: tuple[str, ...]            # after `bench NAME`; {tmp} and {inputs...} are filled in
    keys: tuple[str, ...]            # top-level keys of the JSON
    row_keys: tuple[str, ...] = ()   # keys of every entry of `rows` (when the JSON has rows)
    slow: bool = False
    needs: tuple[str, ...] = field(default=())   # inputs the test makes: "passages", "trace", "site"


FIGURES = [
    Figure("decode", ("--dtype", "float32", "--workloads", "rag,free", "--concurrency", "1", "--modes", "off,auto",
                      "--seeds", "0", "--max-tokens", "4"),
           ("rows", "runs"), ("workload", "concurrency", "mode", "tokens_per_s", "itl_p50_ms", "itl_p95_ms",
                              "acceptance")),
    Figure("steps", ("--dtypes", "float32", "--seeds", "0", "--prompt-tokens", "96", "--token-budget", "32",
                     "--raw", "{tmp}/steps-raw"),
           ("config", "rows"), ("dtype", "arm", "step_ms_p50", "step_ms_p99", "cancel_ms", "new_ttft_ms",
                                "tokens_per_s")),
    Figure("engine", ("--dtype", "float32", "--prompt-lengths", "32", "--repeats", "1", "--scheduler-sizes", "4",
                      "--scheduler-steps", "5"),
           ("prefill_tokens_per_s", "prefill_chunked_tokens_per_s", "scheduler_step_us",
            "scheduler_step_us_by_policy")),
    Figure("blend", ("--parts", "cross", "--passages", "{passages}", "--requests", "2", "--fractions", "1",
                     "--max-tokens", "4", "--seeds", "0", "--dtype", "float32"),
           ("sweep", "cross_request_ttft_speedup", "answer_agreement", "hit_rate", "recompute_fraction"),
           needs=("passages",)),
    Figure("blend", ("--parts", "anns", "--trace", "{trace}", "--max-queries", "2", "--qps", "4", "--seeds", "0",
                     "--dtype", "float32"),
           ("anns", "anns_p95_speedup_exact", "anns_p95_speedup_blend"), slow=True, needs=("trace",)),
    Figure("ingest", ("--source", "{site}", "--base-files", "3", "--ingest-files", "2", "--idle-s", "1",
                      "--embed-passages", "5", "--seeds", "0"),
           ("embed_passages_per_s", "insert_to_searchable_p99_s", "recall_at_10_after_churn", "search_p99_ms_idle",
            "search_p99_ms_ingesting", "runs"), slow=True, needs=("site",)),
    Figure("disagg", ("--rates", "2", "--requests", "2", "--chunks", "2", "--chunk-words", "20", "--chunk-gap-s",
                      "0.05", "--max-tokens", "4", "--idle-probes", "1", "--seeds", "0", "--dtype", "float32",
                      "--raw", "{tmp}/disagg-raw.json"),
           ("rows", "idle", "targets", "workload"), slow=True),
    Figure("fairness", ("--duration", "5", "--flood-users", "2", "--think-s", "0.5", "--prompt-tokens", "32",
                        "--max-tokens", "2", "--max-queue-s", "10", "--seeds", "0"),
           ("light_ttft_p95_solo_s", "light_ttft_p95_fcfs_s", "light_ttft_p95_fair_s", "throughput_fair_over_fcfs",
            "tokens_per_step_fair_over_fcfs", "share_error", "rejected", "hung")),
    Figure("fairness", ("--duration", "5", "--flood-users", "2", "--think-s", "0.5", "--prompt-tokens", "32",
                        "--max-tokens", "2", "--max-queue-s", "10", "--seeds", "0", "--overload", "--overload-s", "3",
                        "--overload-queue-s", "2", "--fleet", "--fleet-s", "5", "--fleet-rpm", "6"),
           ("light_ttft_p95_solo_s", "overload", "fleet_limit_rate_error"), slow=True),
    Figure("embed", ("--passages", "20", "--queries", "4", "--runs", "1", "--batch", "8", "--options", "torch-fp32"),
           ("machine", "options", "passages"), slow=True),
]


def figure_id(figure: Figure) -> str:
    part = next((a for a in figure.argv if a in ("cross", "anns")), "overload" if "--overload" in figure.argv else "")
    return f"{figure.bench}-{part}" if part else figure.bench


def results_page_benches() -> set[str]:
    return set(re.findall(r"streamrag bench ([a-z][a-z-]*)", (ROOT / "docs" / "results.md").read_text()))


def test_every_figure_command_on_the_results_page_has_a_smoke_run():
    smoked = {figure.bench for figure in FIGURES} | {"paper", "gateway"} | set(COVERED)
    assert results_page_benches() <= smoked, results_page_benches() - smoked
    assert all((ROOT / path).is_file() for path in COVERED.values())


def streamrag(*argv: str, timeout: float = 570) -> subprocess.CompletedProcess:
    """`python -m streamrag.cli ARGV` from the repository root, as a user runs it (the suite's environment: no
    CPU lock, tests/conftest.py)."""
    run = subprocess.run([sys.executable, "-m", "streamrag.cli", *argv], cwd=ROOT, env=dict(os.environ),
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"streamrag {' '.join(argv)}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run


def passage_store(path: Path) -> Path:
    """A passage store holding two passages of each of the first questions' answering pages (what `bench blend`'s
    cross-request part draws a question's passages from)."""
    from retriever_svc.corpus.passages import Passage
    from retriever_svc.corpus.store import write_store

    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines()[:4]]
    passages = [Passage(f"{page}:{n}", page, f"{page}#s{n}", f"{q['question']} Passage {n} of {page} answers it.")
                for q in questions for page in q["pages"] for n in range(2)]
    write_store(path, passages, {"source": "test"})
    return path


def make_inputs(figure: Figure, tmp_path: Path) -> dict[str, str]:
    inputs = {"tmp": str(tmp_path)}
    if "passages" in figure.needs:
        inputs["passages"] = str(passage_store(tmp_path / "passages.sqlite"))
    if "trace" in figure.needs:
        from tests.load_tests.test_replay_bench import tiny_trace

        inputs["trace"] = str(tiny_trace(tmp_path / "trace.jsonl"))
    if "site" in figure.needs:
        from tests.support.tiny_corpus import build_tiny_corpus

        inputs["site"] = str(build_tiny_corpus(tmp_path / "site"))
    return inputs


@pytest.mark.timeout(600)   # a model load or two and a few requests: minutes on a loaded 2-core machine
@pytest.mark.parametrize("figure", [pytest.param(f, marks=[pytest.mark.slow] if f.slow else [], id=figure_id(f))
                                    for f in FIGURES])
def test_the_figure_command_runs_tiny_and_writes_its_contract_keys(figure: Figure, tmp_path: Path):
    inputs = make_inputs(figure, tmp_path)
    out = tmp_path / "out.json"
    streamrag("bench", figure.bench, *(arg.format(**inputs) for arg in figure.argv), "--json", str(out))
    result = json.loads(out.read_text())
    assert set(figure.keys) <= result.keys(), set(figure.keys) - result.keys()
    if figure.row_keys:
        assert result["rows"], "no rows"
        for row in result["rows"]:
            assert set(figure.row_keys) <= row.keys(), set(figure.row_keys) - row.keys()


@pytest.mark.slow            # it synthesizes every trace of the paper's steps (about 4 minutes here)
@pytest.mark.timeout(600)
def test_bench_paper_traces_writes_every_steps_trace(tmp_path: Path):
    """`bench paper`'s steps are `bench replay` runs (tests/load_tests/test_replay_bench.py runs one on a tiny
    trace; test_paper.py checks every step's arguments); here its first command, the traces, for real."""
    from load_tests.paper import TRACES

    streamrag("bench", "paper", "traces", "--passages", str(tmp_path / "passages.sqlite"), "--out", str(tmp_path))
    assert {p.name for p in tmp_path.glob("*.jsonl")} >= set(TRACES)


@pytest.mark.timeout(600)   # a whole stack (Redis, retrievers, a replica, the orchestrator) and a gateway
def test_bench_gateway_runs_tiny_and_writes_its_contract_keys(embedded_model_dir, tmp_path: Path):
    from gateway.app import GatewaySettings
    from tests.support.gateway import RunningGateway
    from tests.support.stack import Stack

    (tmp_path / "stack").mkdir()
    stack = Stack(embedded_model_dir, tmp_path / "stack")
    try:
        gateway = RunningGateway(GatewaySettings(orchestrator=f"127.0.0.1:{stack.orchestrator_port}"))
        try:
            out = tmp_path / "gateway.json"
            streamrag("bench", "gateway", "--gateway", gateway.base_url, "--orchestrator",
                      f"127.0.0.1:{stack.orchestrator_port}", "--inference", stack.inference.address,
                      "--questions", "1", "--seeds", "0", "--max-tokens", "4", "--locust-seconds", "0",
                      "--json", str(out))
        finally:
            gateway.stop()
    finally:
        stack.stop()
    result = json.loads(out.read_text())
    assert {"ttft_added_s", "ttft_added_outside_s", "per_token_added_s", "kv_blocks_all_free"} <= result.keys()
    assert result["kv_blocks_all_free"] is True
