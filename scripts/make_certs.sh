#!/usr/bin/env bash
# A local CA and one certificate per streamrag service, for TLS and mutual TLS between services
# (servicekit/tls.py) and HTTPS on the gateway: `streamrag certs --out OUT_DIR` (streamrag/stack/certs.py),
# run from this checkout. Not for the public internet: the CA key sits beside the certificates.
#
#   bash scripts/make_certs.sh [OUT_DIR] [streamrag certs flags...]     # default: ./certs
#
# Writes OUT_DIR/ca.crt (give it to every service as --tls-ca and to clients to verify the gateway)
# and, per compose service name, OUT_DIR/NAME.crt and NAME.key, each naming its service (and the
# names it is dialed by: `orchestrators`, `orchestrator`, `inference`), localhost, 127.0.0.1 and ::1,
# valid for server and client use. `client` is for tools and users (e.g. `streamrag ask` over mutual
# TLS). A CA already in OUT_DIR is reused; the certificates are overwritten. More flags pass on, e.g.
# `--namespace NS --k8s-secrets secrets.yaml` for Kubernetes (deploy/k8s/README.md).
# Python: $PYTHON, else the checkout's .venv, else python3 (it needs the `cryptography` package).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-certs}"
shift || true
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m streamrag.stack.certs --out "$out" \
  --days "${STREAMRAG_CERT_DAYS:-825}" "$@"
