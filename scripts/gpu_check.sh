#!/usr/bin/env bash
# The one prepared GPU run: the `cuda` tests, `streamrag bench gpu`, then the profile of a few steps
# (load_tests/gpu_profile.py), in under 10 minutes.
# It needs only this repository and the GPU machine's own PyTorch, Triton, transformers and pytest
# (nothing is installed there; the weights are random, since none can travel).
#   bash scripts/gpu_check.sh            # on the GPU machine; results under $OUT (default /tmp/gpu-check)
#   bash scripts/gpu_check.sh --dry-run  # on a CPU first: collects the cuda tests, runs `bench gpu --device cpu --small`
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0
step() { printf '\n==> %s\n' "$*"; }

if [[ "${1:-}" == "--dry-run" ]]; then
  step "cuda tests (collected only: no GPU here)"
  "$PY" -m pytest --run-cuda -m cuda tests/engine/test_cuda.py --collect-only -q -p no:cacheprovider || status=1
  step "bench gpu, CPU dry run"
  timeout 300 "$PY" -m streamrag.cli bench gpu --device cpu --small --json "$OUT/gpu-small.json" || status=1
  step "profile, CPU dry run"
  timeout 300 "$PY" -m load_tests.gpu_profile --device cpu --small --json "$OUT/profile-small.json" || status=1
  exit $status
fi

"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
step "cuda tests"
timeout 120 "$PY" -m pytest --run-cuda -m cuda tests/engine/test_cuda.py tests/engine/test_triton_attention.py \
  -q -p no:cacheprovider -o addopts="" 2>&1 | tee "$OUT/cuda-tests.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
step "bench gpu"
timeout 330 "$PY" -m streamrag.cli bench gpu --json "$OUT/gpu.json" 2>&1 | tee "$OUT/bench-gpu.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
step "profile"
timeout 120 "$PY" -m load_tests.gpu_profile --json "$OUT/profile.json" 2>&1 | tee "$OUT/profile.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
exit $status
