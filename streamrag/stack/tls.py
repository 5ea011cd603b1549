"""`streamrag up --tls-dir DIR`: the stack's certificates, and how its services and clients use them.

DIR holds the files of `scripts/make_certs.sh` (a local CA, `ca.crt`, and one certificate per
service name); when it has no `ca.crt`, `up` runs the script to make them. Every gRPC service
(retrievers, replicas, orchestrator) then serves mutual TLS with its own certificate and presents
it when it calls another; the gateway serves HTTPS and dials the orchestrator over mutual TLS. The
replicas share the `inference` certificate. Redis and the corpus web server stay plaintext on
loopback, as in compose's TLS override. The stack's own checks (`up`, `status`) and its clients
(`streamrag ask`) present the `client` certificate and verify the services against `ca.crt`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from servicekit.tls import TlsFiles

MAKE_CERTS = Path(__file__).resolve().parents[2] / "scripts" / "make_certs.sh"
CLIENT = "client"
TLS_KINDS = ("retriever", "inference", "orchestrator", "gateway")   # the services that serve TLS


def cert_name(service_name: str, kind: str) -> str:
    """Whose certificate a service presents: its own name's (anns, crawler, orchestrator, gateway), a
    replica the shared `inference` one (the script makes only inference-0 and -1; the stack has up to 9)."""
    return "inference" if kind == "inference" else service_name


def tls_files(tls_dir: Path, name: str) -> TlsFiles:
    return TlsFiles(tls_dir / f"{name}.crt", tls_dir / f"{name}.key", tls_dir / "ca.crt")


def tls_flags(tls_dir: Path, name: str) -> list[str]:
    """The `--tls-cert/--tls-key/--tls-ca` flags of a service presenting certificate `name`."""
    files = tls_files(tls_dir, name)
    return ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]


def prepare_certs(tls_dir: Path, names: list[str]) -> str | None:
    """Make the certificates in `tls_dir` when it has no CA, then check that every one of `names` (and
    the client's) is there. Returns what is wrong (a message for the user), or None."""
    if not (tls_dir / "ca.crt").is_file():
        if shutil.which("openssl") is None:
            return f"--tls-dir {tls_dir}: no ca.crt there, and openssl (needed to make one) is not installed"
        if not MAKE_CERTS.is_file():
            return f"--tls-dir {tls_dir}: no ca.crt there, and {MAKE_CERTS} (which makes them) is missing"
        print(f"making a local CA and the stack's certificates in {tls_dir} (scripts/make_certs.sh)", flush=True)
        made = subprocess.run(["bash", str(MAKE_CERTS), str(tls_dir)], capture_output=True, text=True)
        if made.returncode != 0:
            return f"scripts/make_certs.sh {tls_dir} failed: {made.stderr.strip() or made.stdout.strip()}"
    missing = [f"{name}.{ext}" for name in sorted({*names, CLIENT}) for ext in ("crt", "key")
               if not (tls_dir / f"{name}.{ext}").is_file()]
    if missing:
        return (f"--tls-dir {tls_dir}: {', '.join(missing)} missing (make the whole set with "
                f"`bash scripts/make_certs.sh {tls_dir}`, or move ca.crt away to let `up` make it)")
    return None


def stack_client_tls(options: dict) -> TlsFiles | None:
    """How the stack's own checks and clients dial it: the client certificate, or None (plaintext)."""
    tls_dir = options.get("tls_dir")
    return tls_files(Path(tls_dir), CLIENT) if tls_dir else None
