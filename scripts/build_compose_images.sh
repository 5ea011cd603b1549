#!/usr/bin/env bash
# Builds the compose stack's images on a machine where no registry can be reached:
#   1. the local base images (scripts/build_base_images.sh: local/python:3.11, local/redis:7);
#   2. torch 2.13.0 CPU into compose/wheels/ (`pip download`: this machine's pip finds the local wheel);
#   3. this machine's extra CA certificates (/usr/local/share/ca-certificates/*.crt) into compose/certs/,
#      so pip inside the build trusts the TLS proxy between it and PyPI;
#   4. `docker-compose build` (compose v1; `docker compose` v2 where installed) with those settings.
# compose/wheels/ and compose/certs/ are never committed (their .gitignore keeps them out).
#
#   bash scripts/build_compose_images.sh                 # the full Python docs index (~8 min of embedding)
#   STREAMRAG_INDEX_SOURCE=/usr/share/doc/python3.11/html/tutorial bash scripts/build_compose_images.sh
#
# Then, with the same variables exported (the script prints them):
#   docker-compose -p streamrag -f compose/docker-compose.yml up -d
# Where a registry is reachable none of this is needed: `docker compose -f compose/docker-compose.yml build`
# uses python:3.11-slim-bookworm, redis:7-alpine and the PyTorch CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."

export STREAMRAG_BASE_IMAGE=${STREAMRAG_BASE_IMAGE:-local/python:3.11}
export STREAMRAG_REDIS_IMAGE=${STREAMRAG_REDIS_IMAGE:-local/redis:7}
# The local wheel (2.13.0+cpu) sorts above PyPI's 2.13.0, so pip takes it; torch's own dependencies come from PyPI.
export STREAMRAG_TORCH_INDEX_URL=${STREAMRAG_TORCH_INDEX_URL:-https://pypi.org/simple}
step() { printf '\n==> %s\n' "$*"; }
t0=$SECONDS

if [[ $STREAMRAG_BASE_IMAGE == local/* || $STREAMRAG_REDIS_IMAGE == local/* ]]; then
  bash scripts/build_base_images.sh
fi

if ! compgen -G "compose/wheels/torch-2.13.0*.whl" >/dev/null; then
  step "torch 2.13.0 CPU -> compose/wheels/"
  pip=(python3 -m pip)
  [[ -x .venv/bin/python ]] && pip=(.venv/bin/python -m pip)
  "${pip[@]}" download -q --no-deps -d compose/wheels torch==2.13.0
fi
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt compose/certs/
fi

compose=(docker-compose)
command -v docker-compose >/dev/null || compose=(docker compose)
step "${compose[*]} build (STREAMRAG_INDEX_SOURCE=${STREAMRAG_INDEX_SOURCE:-all the Python docs})"
"${compose[@]}" -p "${COMPOSE_PROJECT_NAME:-streamrag}" -f compose/docker-compose.yml build
step "built in $((SECONDS - t0)) s; start the stack with:"
echo "  STREAMRAG_REDIS_IMAGE=$STREAMRAG_REDIS_IMAGE ${compose[*]} -p streamrag -f compose/docker-compose.yml up -d"
