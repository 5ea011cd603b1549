"""TLS between services, optionally mutual: the flags, the gRPC credentials, the channels.

Every service takes the same three flags (env `STREAMRAG_<SERVICE>_TLS_CERT`, `..._TLS_KEY`,
`..._TLS_CA`):

    --tls-cert FILE   this service's certificate chain (PEM); served on its port, and presented
                      as its client certificate when it calls another service
    --tls-key FILE    the certificate's private key (PEM)
    --tls-ca FILE     the CA that signs the other services' certificates: a server with it
                      requires and verifies client certificates (mutual TLS); a client with it
                      dials with TLS and verifies the server against it

`streamrag certs --out DIR` (or `scripts/make_certs.sh DIR`) makes a local CA and one certificate per
service (its compose and, with `--namespace`, Kubernetes DNS names, and loopback), valid for both
server and client use. A client verifies the service it dials (`authority_options`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from servicekit.config import env_default, env_name

CA_HELP = "CA certificate (PEM): require client certificates it signed, and verify the services this one calls"


def add_tls_args(parser: argparse.ArgumentParser, service: str, ca_help: str = CA_HELP) -> None:
    parser.add_argument("--tls-cert", default=env_default(service, "tls_cert", None),
                        help=f"certificate chain (PEM) to serve with TLS and present as a client "
                             f"(env {env_name(service, 'tls_cert')})")
    parser.add_argument("--tls-key", default=env_default(service, "tls_key", None),
                        help=f"private key of --tls-cert (PEM) (env {env_name(service, 'tls_key')})")
    parser.add_argument("--tls-ca", default=env_default(service, "tls_ca", None),
                        help=f"{ca_help} (env {env_name(service, 'tls_ca')})")


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of one service. `cert`/`key` come together; `ca` turns on verification of the peer."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    @property
    def serves(self) -> bool:
        return self.cert is not None

    def server_credentials(self) -> grpc.ServerCredentials:
        """TLS on a gRPC port; with `ca`, a client must present a certificate the CA signed."""
        if self.cert is None or self.key is None:
            raise ValueError("serving TLS needs --tls-cert and --tls-key")
        return grpc.ssl_server_credentials([(self.key.read_bytes(), self.cert.read_bytes())],
                                           root_certificates=_read(self.ca), require_client_auth=self.ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Dial with TLS, verify the server against `ca`, present `cert` when there is one (mutual TLS)."""
        return grpc.ssl_channel_credentials(root_certificates=_read(self.ca), private_key=_read(self.key),
                                            certificate_chain=_read(self.cert))


MULTI_ADDRESS_SCHEMES = ("ipv4:", "ipv6:")
# The names clients verify a service by when they dial it by address (a list, or an IP): the set of
# orchestrators (`orchestrators`, which every orchestrator's certificate names), an inference replica
# (`inference`); a retriever by its kind (`anns`, `crawler`, `replay`). `streamrag certs` names them.
ORCHESTRATORS = "orchestrators"
INFERENCE = "inference"


def authority_options(target: str, server_name: str | None = None) -> tuple[tuple[str, str], ...]:
    """The channel options a TLS channel to `target` needs to verify its servers.

    A target that names a host (`dns:///orchestrator:50051`, `inference-0:50052`) is verified
    against that name, gRPC's default: nothing to add. A target of addresses (`ipv4:a:p,b:q`,
    `servicekit.channels.spread_target`'s, or one IP address) names no host: with `server_name`
    (the service dialed), every server's certificate must name that service
    (`grpc.ssl_target_name_override`; it is the channel's authority too); without it, the first
    address stands for all of them (gRPC's own authority for a list is the whole list, which no
    certificate names: "Hostname Verification Check failed")."""
    addresses = _addresses(target)
    if not addresses:
        return ()
    if server_name:
        return (("grpc.ssl_target_name_override", server_name), ("grpc.default_authority", server_name))
    if len(addresses) == 1:
        return ()
    return (("grpc.default_authority", addresses[0]),)


def _addresses(target: str) -> list[str]:
    """The addresses of a target made of IP addresses; [] for one that names a host."""
    if target.startswith(MULTI_ADDRESS_SCHEMES):
        return [a.strip() for a in target.split(":", 1)[1].split(",") if a.strip()]
    if "://" in target or target.startswith(("dns:", "unix:")):
        return []
    host = target.rsplit(":", 1)[0].strip("[]") if target.count(":") == 1 or target.startswith("[") else target
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return []
    return [target]


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def tls_note(tls: TlsFiles | None) -> str:
    """How a port is served, for a service's start-up line: "", "TLS" or "mutual TLS"."""
    if tls is None or not tls.serves:
        return ""
    return "mutual TLS" if tls.ca is not None else "TLS"


def client_tls(environ: Mapping[str, str] = os.environ) -> TlsFiles | None:
    """The TLS a client (`streamrag ask`, ...) dials with: `STREAMRAG_CLIENT_TLS_CA`, and for mutual TLS
    `..._CERT`/`..._KEY` (`streamrag.stack` sets them for a stack started with --tls-dir); None: plaintext."""
    cert, key, ca = (environ.get(env_name("client", name)) for name in ("tls_cert", "tls_key", "tls_ca"))
    return TlsFiles(*(Path(p) if p else None for p in (cert, key, ca))) if ca else None


def tls_from_args(args: argparse.Namespace) -> TlsFiles | None:
    """The files named by --tls-cert/--tls-key/--tls-ca, checked; None when none is given."""
    cert, key, ca = (getattr(args, name, None) for name in ("tls_cert", "tls_key", "tls_ca"))
    if not (cert or key or ca):
        return None
    if bool(cert) != bool(key):
        raise SystemExit("error: --tls-cert and --tls-key go together")
    paths = [Path(p) if p else None for p in (cert, key, ca)]
    for flag, path in zip(("--tls-cert", "--tls-key", "--tls-ca"), paths, strict=True):
        if path is not None and not path.is_file():
            raise SystemExit(f"error: {flag} {path}: no such file")
    return TlsFiles(*paths)

