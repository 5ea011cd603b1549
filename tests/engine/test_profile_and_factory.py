"""`streamrag profile` output feeds the cost model, and the factory builds a working engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from inference_svc.engine.cost_model import CostModel
from inference_svc.engine.engine import EngineConfig
from inference_svc.engine.factory import EngineSpec, build_engine
from inference_svc.engine.kv_cache import kv_bytes_per_block
from inference_svc.engine.models import load_config
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams

REPO = Path(__file__).resolve().parents[2]


def test_profile_command_writes_a_profile_the_cost_model_loads(embedded_model_dir, tmp_path):
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, "-m", "streamrag.cli", "profile", "--model", str(embedded_model_dir),
         "--tokens", "16,128", "--repeats", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    assert "[recompute 2/2]" in proc.stderr and "[swap" in proc.stderr   # progress is shown
    profile = json.loads(out.read_text())
    assert [p[0] for p in profile["recompute_ms"]] == [16, 128]
    model = CostModel.load(out)
    assert model.recompute_ms(128) > 0 and model.swap_ms(8) > 0
    assert model.recompute_ms(4096) > model.recompute_ms(16)


def test_factory_sizes_the_device_pool_from_bytes_and_answers(embedded_model_dir, tmp_path):
    from inference_svc.engine.factory import DTYPES
    from servicekit.hardware import resolve_dtype

    per_block = kv_bytes_per_block(load_config(embedded_model_dir), 16, DTYPES[resolve_dtype("auto")])
    spec = EngineSpec(model_dir=embedded_model_dir, kv_device_bytes=40 * per_block + 1, kv_cpu_blocks=8,
                      engine=EngineConfig(policy="mcps"), profile=tmp_path / "missing.json")
    engine = build_engine(spec)
    assert engine.scheduler.kv.device.num_blocks == 40
    assert engine.cost_model.source == "built-in"
    engine.open("q", [Segment(text="<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                                   "<|im_start|>assistant\n")], SamplingParams(max_tokens=8))
    engine.finish("q")
    text = ""
    while engine.has_unfinished():
        text += "".join(e.text for e in engine.step())
    assert "Paris" in text
