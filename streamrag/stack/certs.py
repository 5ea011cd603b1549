"""`streamrag certs`: a local CA and one certificate per service, for mutual TLS between the services
(servicekit/tls.py) and HTTPS on the gateway, locally, in compose and on Kubernetes.

    streamrag certs --out certs                                    # compose and `up --tls-dir` names
    streamrag certs --out certs --namespace streamrag --k8s-secrets secrets.yaml

Writes OUT/ca.crt and ca.key (an existing pair in OUT is reused, so certificates already handed out
stay valid; `--new-ca` replaces it) and, per service, OUT/SERVICE.crt and SERVICE.key. Every
certificate is valid for server and client use (one pair serves a service's port and identifies it
when it calls another) and names:
- the service and the names a client dials it by: each orchestrator `orchestrators` (the set the
  gateway and `streamrag ask` dial) and `orchestrator`, each replica `inference`;
- loopback: `localhost`, 127.0.0.1 and ::1 (health checks dial the pod itself);
- with `--namespace NS`, its Kubernetes DNS names: `svc`, `svc.NS`, `svc.NS.svc`,
  `svc.NS.svc.cluster.local`, and for a headless Service (inference, orchestrator, anns, redis) its
  pods' names too, `*.svc.NS.svc` and `*.svc.NS.svc.cluster.local`.
`client` is for tools and users (`streamrag ask` over mutual TLS). `--k8s-secrets FILE` also writes
one Secret per service (not the client), `<service>-tls`, type kubernetes.io/tls, with the keys
`tls.crt`, `tls.key` and `ca.crt`, for `kubectl apply -f FILE` (deploy/k8s/README.md). Not for
the public internet: the CA key sits beside the certificates.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import sys
from collections.abc import Sequence
from pathlib import Path

# The compose services and the local stack's extra orchestrators; `client` last.
SERVICES = ("gateway", "orchestrator", "orchestrator-1", "orchestrator-2", "orchestrator-3", "inference",
            "inference-0", "inference-1", "anns", "crawler", "replay", "corpus", "redis", "client")
HEADLESS = frozenset({"inference", "orchestrator", "anns", "redis"})   # pods with names of their own
LOOPBACK = ("localhost", "127.0.0.1", "::1")
CLIENT = "client"
DEFAULT_DAYS = 825
NAME_HELP = "lower-case letters, digits and '-', starting with a letter"


def service_names(service: str) -> list[str]:
    """The names a service's certificate carries before Kubernetes ones: its own, then its set's."""
    if service.startswith("orchestrator"):
        return list(dict.fromkeys([service, "orchestrator", "orchestrators"]))
    if service.startswith("inference"):
        return list(dict.fromkeys([service, "inference"]))
    return [service]


def dns_names(service: str, namespace: str | None = None) -> list[str]:
    """Every name `service`'s certificate names (loopback included), in order."""
    names = service_names(service) if service != CLIENT else [CLIENT]
    if namespace and service != CLIENT:
        for name in list(names):
            names += [f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]
            if name in HEADLESS:
                names += [f"*.{name}.{namespace}.svc", f"*.{name}.{namespace}.svc.cluster.local"]
    return list(dict.fromkeys([*names, *LOOPBACK]))


def _check_name(kind: str, name: str) -> None:
    if not name or not name[0].isalpha() or not all(c.islower() or c.isdigit() or c == "-" for c in name):
        raise ValueError(f"{kind} {name!r} is not a DNS label ({NAME_HELP})")


def _subject_alt_names(names: Sequence[str]):
    from cryptography import x509

    entries = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load_or_make_ca(out: Path, days: int, new: bool):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = out / "ca.crt", out / "ca.key"
    if not new and cert_path.is_file() and key_path.is_file():
        return (x509.load_pem_x509_certificate(cert_path.read_bytes()),
                serialization.load_pem_private_key(key_path.read_bytes(), None))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamrag local CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write(key_path, _pem_key(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def issue(ca_cert, ca_key, common_name: str, names: Sequence[str], days: int) -> tuple[bytes, bytes]:
    """A certificate (PEM) for `names`, signed by the CA, valid for server and client use, and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(_subject_alt_names(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    path.chmod(0o600 if private else 0o644)


def make_certs(out: Path, services: Sequence[str] = SERVICES, *, namespace: str | None = None,
               days: int = DEFAULT_DAYS, new_ca: bool = False) -> dict[str, list[str]]:
    """Issue OUT/SERVICE.crt and .key for every service (and the client); returns each one's names."""
    if namespace is not None:
        _check_name("--namespace", namespace)
    for service in services:
        _check_name("service", service)
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _load_or_make_ca(out, days, new_ca)
    issued = {}
    for service in dict.fromkeys([*services, CLIENT]):
        names = dns_names(service, namespace)
        cert, key = issue(ca_cert, ca_key, service, names, days)
        _write(out / f"{service}.key", key, private=True)
        _write(out / f"{service}.crt", cert)
        issued[service] = names
    return issued


def k8s_secrets(out: Path, services: Sequence[str], namespace: str | None = None) -> str:
    """One `<service>-tls` Secret (kubernetes.io/tls: tls.crt, tls.key, ca.crt) per service, as YAML."""
    ca = base64.b64encode((out / "ca.crt").read_bytes()).decode()
    documents = []
    for service in services:
        if service == CLIENT:
            continue
        crt, key = (base64.b64encode((out / f"{service}.{ext}").read_bytes()).decode() for ext in ("crt", "key"))
        meta = f"  name: {service}-tls\n" + (f"  namespace: {namespace}\n" if namespace else "")
        documents.append(f"apiVersion: v1\nkind: Secret\nmetadata:\n{meta}"
                         f"  labels:\n    app.kubernetes.io/part-of: streamrag\ntype: kubernetes.io/tls\n"
                         f"data:\n  tls.crt: {crt}\n  tls.key: {key}\n  ca.crt: {ca}\n")
    return "---\n".join(documents)


def add_certs_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("certs"), metavar="DIR",
                        help="where the CA and the certificates go (default ./certs)")
    parser.add_argument("--namespace", default=None, metavar="NS",
                        help="name the Kubernetes DNS names of each service in namespace NS too")
    parser.add_argument("--service", action="append", default=None, metavar="NAME",
                        help=f"a service to issue for, repeatable (default: {' '.join(SERVICES)})")
    parser.add_argument("--k8s-secrets", type=Path, default=None, metavar="FILE",
                        help="also write a <service>-tls Secret per service (kubernetes.io/tls: tls.crt, tls.key, "
                             "ca.crt) to FILE, for kubectl apply -f")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS, help=f"validity (default {DEFAULT_DAYS} days)")
    parser.add_argument("--new-ca", action="store_true", help="replace a CA already in DIR (default: reuse it)")


def run_certs(args: argparse.Namespace) -> int:
    services = args.service or list(SERVICES)
    if args.days < 1:
        print(f"error: --days must be 1 or more, got {args.days}", file=sys.stderr)
        return 2
    try:
        issued = make_certs(args.out, services, namespace=args.namespace, days=args.days, new_ca=args.new_ca)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.k8s_secrets is not None:
        args.k8s_secrets.write_text(k8s_secrets(args.out, services, args.namespace))
        args.k8s_secrets.chmod(0o600)
    print(f"certificates for {' '.join(issued)} in {args.out} (CA: {args.out / 'ca.crt'})"
          + (f"; Secrets in {args.k8s_secrets}" if args.k8s_secrets is not None else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m streamrag.stack.certs` (scripts/make_certs.sh): the same flags as `streamrag certs`."""
    parser = argparse.ArgumentParser(prog="python -m streamrag.stack.certs", description=__doc__.split("\n")[0])
    add_certs_args(parser)
    return run_certs(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
