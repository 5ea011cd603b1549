#!/usr/bin/env bash
# The Stream2LLM replay at the paper's scale on one GPU (`streamrag bench gpu-replay`), in at most 4 minutes:
# crawler at 4 QPS and ANNS at 1 QPS, streaming against not, Llama-3.1-8B shape with random weights, bf16.
# It needs only this repository (the token traces under load_tests/traces/paper/) and the GPU machine's own
# PyTorch, Triton and transformers.
#   bash scripts/gpu_replay.sh            # on the GPU machine; results under $OUT (default /tmp/gpu-replay)
#   bash scripts/gpu_replay.sh --dry-run  # on a CPU first: `bench gpu-replay --device cpu --small`
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
OUT=${OUT:-/tmp/gpu-replay}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
step() { printf '\n==> %s\n' "$*"; }

if [[ "${1:-}" == "--dry-run" ]]; then
  step "bench gpu-replay, CPU dry run"
  timeout 120 "$PY" -m streamrag.cli bench gpu-replay --device cpu --small --json "$OUT/gpu-replay-small.json" \
    2>&1 | tee "$OUT/gpu-replay-small.txt"
  exit "${PIPESTATUS[0]}"
fi

"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader || true
step "bench gpu-replay"
timeout 240 "$PY" -m streamrag.cli bench gpu-replay --json "$OUT/gpu-replay.json" "$@" 2>&1 | tee "$OUT/gpu-replay.txt"
exit "${PIPESTATUS[0]}"
