"""`streamrag bench gpu --device cpu --small`: the GPU check's dry run, the same steps on a tiny shape with
the Triton kernels in Triton's interpreter. It must finish and write the keys other people's scripts read
(design section 10), and the engine must be exact in fp32 through the kernels.

It runs as docs/gpu.md says, from a fresh shell: a subprocess without `TRITON_INTERPRET` in its
environment, so the interpreter is chosen by the code (inference_svc/engine/__init__.py), before
anything imports Triton, not by the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamrag.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)   # the kernels in Triton's interpreter: minutes on a loaded 2-core machine
@pytest.mark.slow   # a minute in Triton's interpreter; scripts/gpu_check.sh --dry-run runs it too
def test_bench_gpu_dry_run_writes_the_contract_keys(tmp_path):
    out = tmp_path / "gpu.json"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "streamrag.cli", "bench", "gpu", "--device", "cpu", "--small",
                          "--decode-steps", "2", "--json", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=570)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("gpu", "hbm_tb_s", "matmul_tflops", "exact_fp32", "decode", "prefill", "streaming",
                "host_syncs_per_step", "launches_per_step"):
        assert key in result, key
    assert result["exact_fp32"] is True, result["exactness"]
    assert result["exactness"]["recompute_preemptions"] > 0 and result["exactness"]["swap_preemptions"] > 0
    for row in result["decode"]:
        assert {"concurrency", "fresh_step_ms", "repeated_step_ms", "roofline_fraction"} <= row.keys()
    assert {(r["tokens"], r["chunk"]) for r in result["prefill"]} == {(128, None), (128, 32)}
    assert all(r["mfu"] >= 0 for r in result["prefill"])
    assert [r["gap_ms"] for r in result["streaming"]] == [100, 25]
    assert result["launches_per_step"] is None   # nothing to count on a CPU


def test_bench_gpu_refuses_a_full_run_on_the_cpu(capsys):
    assert main(["bench", "gpu", "--device", "cpu"]) == 2
    assert "--device cpu --small" in capsys.readouterr().err
