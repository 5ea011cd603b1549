#!/usr/bin/env bash
# Builds the base images the compose stack needs, where no registry can be reached (`docker pull`
# fails): a Debian bookworm root made by debootstrap, and two images on top of it.
#
#   local/bookworm:base      debootstrap --variant=minbase bookworm, imported with `docker import`
#   local/python:3.11        + Debian's python3.11 in a venv at /opt/venv (on PATH: `python`, `pip`)
#   local/redis:7            + Debian's redis-server and redis-cli, working directory /data
#
# Then build and run the stack on them (compose v1 or v2, from the repository root):
#   STREAMRAG_BASE_IMAGE=local/python:3.11 STREAMRAG_REDIS_IMAGE=local/redis:7 \
#     docker-compose -p streamrag -f compose/docker-compose.yml up --build -d
#
#   bash scripts/build_base_images.sh            # build what is missing (about 2 minutes)
#   bash scripts/build_base_images.sh --rebuild  # build all three again
# Needs root (debootstrap), debootstrap and a running dockerd. MIRROR overrides the apt mirror
# (default: the first URI of this machine's Debian sources, else deb.debian.org).
set -euo pipefail
cd "$(dirname "$0")/.."

rebuild=0
[[ "${1:-}" == "--rebuild" ]] && rebuild=1
BASE=local/bookworm:base
PYTHON_IMAGE=${STREAMRAG_BASE_IMAGE:-local/python:3.11}
REDIS_IMAGE=${STREAMRAG_REDIS_IMAGE:-local/redis:7}
DOCKER=${DOCKER:-docker}
step() { printf '\n==> %s\n' "$*"; }
have() { [[ $rebuild -eq 0 ]] && "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

if [[ -z "${MIRROR:-}" ]]; then
  MIRROR=$(grep -h -m1 -E '^(URIs:|deb )' /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null \
           | head -1 | awk '{print $2}' || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi

if ! have "$BASE"; then
  command -v debootstrap >/dev/null || { echo "error: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
  root=$(mktemp -d /tmp/streamrag-bookworm.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  step "debootstrap --variant=minbase bookworm from $MIRROR (about 50 s)"
  t0=$SECONDS
  debootstrap --variant=minbase bookworm "$root" "$MIRROR" >/tmp/streamrag-debootstrap.log 2>&1 \
    || { tail -20 /tmp/streamrag-debootstrap.log >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  step "docker import -> $BASE ($((SECONDS - t0)) s so far)"
  tar -C "$root" -c . | "$DOCKER" import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  rm -rf "$root"
  trap - EXIT
fi

if ! have "$PYTHON_IMAGE"; then
  step "$PYTHON_IMAGE: python3.11 in /opt/venv"
  # Debian's pip refuses system-wide installs (PEP 668): a venv on PATH gives `python` and `pip`
  # where python:3.11-slim-bookworm has them.
  "$DOCKER" build -q -t "$PYTHON_IMAGE" - <<EOF
FROM $BASE
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["python"]
EOF
fi

if ! have "$REDIS_IMAGE"; then
  step "$REDIS_IMAGE: Debian's redis-server"
  "$DOCKER" build -q -t "$REDIS_IMAGE" - <<EOF
FROM $BASE
RUN apt-get update && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /data
WORKDIR /data
EXPOSE 6379
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no"]
EOF
fi

"$DOCKER" image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E "^(local/|${PYTHON_IMAGE%%:*}|${REDIS_IMAGE%%:*})" \
  | sort -u
