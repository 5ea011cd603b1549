"""`streamrag up --tls-dir DIR`: the stack's certificates, and how its services and clients use them.

DIR holds the files of `streamrag certs` (a local CA, `ca.crt`, and one certificate per service
name); when it has no `ca.crt`, `up` makes them. Every gRPC service
(retrievers, replicas, orchestrator) then serves mutual TLS with its own certificate and presents
it when it calls another; the gateway serves HTTPS and dials the orchestrator over mutual TLS. The
replicas share the `inference` certificate. Redis and the corpus web server stay plaintext on
loopback, as in compose's TLS override. The stack's own checks (`up`, `status`) and its clients
(`streamrag ask`) present the `client` certificate and verify the services against `ca.crt`.
"""

from __future__ import annotations

from pathlib import Path

from servicekit.tls import TlsFiles
from streamrag.stack.certs import CLIENT, SERVICES, make_certs

TLS_KINDS = ("retriever", "inference", "orchestrator", "gateway")   # the services that serve TLS


def cert_name(service_name: str, kind: str) -> str:
    """Whose certificate a service presents: its own name's (anns, crawler, orchestrator, gateway), a
    replica the shared `inference` one (`streamrag certs` makes only inference-0 and -1; the stack has up to 9)."""
    return "inference" if kind == "inference" else service_name


def tls_files(tls_dir: Path, name: str) -> TlsFiles:
    return TlsFiles(tls_dir / f"{name}.crt", tls_dir / f"{name}.key", tls_dir / "ca.crt")


def tls_flags(tls_dir: Path, name: str) -> list[str]:
    """The `--tls-cert/--tls-key/--tls-ca` flags of a service presenting certificate `name`."""
    files = tls_files(tls_dir, name)
    return ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]


def prepare_certs(tls_dir: Path, names: list[str]) -> str | None:
    """Make the certificates in `tls_dir` when it has no CA (`streamrag certs`), then check that every
    one of `names` (and the client's) is there. Returns what is wrong (a message for the user), or None."""
    if not (tls_dir / "ca.crt").is_file():
        print(f"making a local CA and the stack's certificates in {tls_dir} (streamrag certs)", flush=True)
        try:
            make_certs(tls_dir, list(dict.fromkeys([*SERVICES, *names])))
        except (OSError, ValueError) as exc:
            return f"--tls-dir {tls_dir}: could not make the certificates: {exc}"
    missing = [f"{name}.{ext}" for name in sorted({*names, CLIENT}) for ext in ("crt", "key")
               if not (tls_dir / f"{name}.{ext}").is_file()]
    if missing:
        return (f"--tls-dir {tls_dir}: {', '.join(missing)} missing (make them with "
                f"`streamrag certs --out {tls_dir}`, which keeps the CA there)")
    return None


def stack_client_tls(options: dict) -> TlsFiles | None:
    """How the stack's own checks and clients dial it: the client certificate, or None (plaintext)."""
    tls_dir = options.get("tls_dir")
    return tls_files(Path(tls_dir), CLIENT) if tls_dir else None
