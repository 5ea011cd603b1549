#!/usr/bin/env bash
# A local CA and one certificate per streamrag service, for TLS and mutual TLS between services
# (servicekit/tls.py) and HTTPS on the gateway. Not for the public internet: the CA key sits beside
# the certificates.
#
#   bash scripts/make_certs.sh [OUT_DIR]          # default: ./certs
#
# Writes OUT_DIR/ca.crt (give it to every service as --tls-ca and to clients to verify the gateway)
# and, for each name below, OUT_DIR/NAME.crt and NAME.key. Every certificate names its service
# (the compose service name), localhost and 127.0.0.1, and is valid for both server and client use,
# so one pair serves a service's port and identifies it when it calls another. `client` is for
# tools and users (e.g. `streamrag ask` over mutual TLS). Existing files are overwritten.
set -euo pipefail

out="${1:-certs}"
days="${STREAMRAG_CERT_DAYS:-825}"
names=(gateway orchestrator orchestrator-1 inference inference-0 inference-1 anns crawler replay corpus redis client)
# Every compose orchestrator answers to the network alias `orchestrators` too (the gateway dials it).
declare -A extra_san=([orchestrator]=",DNS:orchestrators" [orchestrator-1]=",DNS:orchestrators")

mkdir -p "$out"
cd "$out"
umask 077

openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" -keyout ca.key -out ca.crt \
  -subj "/CN=streamrag local CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

for name in "${names[@]}"; do
  openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$name.key" -out "$name.csr" -subj "/CN=$name" 2>/dev/null
  printf '%s\n' \
    "basicConstraints=CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth,clientAuth" \
    "subjectAltName=DNS:$name,DNS:localhost,IP:127.0.0.1${extra_san[$name]:-}" > "$name.ext"
  openssl x509 -req -sha256 -days "$days" -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "$name.crt" -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
done
rm -f ca.srl
chmod 644 ./*.crt
echo "certificates for ${names[*]} in $(pwd) (CA: ca.crt)"
