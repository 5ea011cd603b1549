"""Tenants: who shares the service, with what weight and what limits, read once from a TOML file.

    [tenants.acme]
    keys = ["KEY1", "KEY2"]
    weight = 1.0               # fair share inside a replica
    max_concurrent = 8         # optional limits: absent means none
    requests_per_minute = 120
    tokens_per_minute = 50000  # prompt and generated tokens
    max_queue_s = 60           # the longest a request may wait to start (default 60)
    admin = false              # true: may read every tenant's request records (default false)

`--tenants FILE` (env `STREAMRAG_<SERVICE>_TENANTS`) on the gateway and the orchestrator. A key of
the plain key file (`--api-key-file`) or `STREAMRAG_API_KEY` that no tenant lists is a tenant of its
own: weight 1, no limits, named `key-` and the first 8 hex digits of the key's SHA-256 (never the key).
Such a key is also the stack's own: the gateway calls the orchestrator with it and names the tenant
it acts for in the call's metadata (`protos.metadata.TENANT_KEY`), which only these keys may do.

A tenant reads only its own requests' records (orchestrator/tenancy.py's `reader_scope`); an `admin`
tenant reads every tenant's, as does the stack's own key when its call names no tenant (the operator).

Bad input is one line naming the file and line: bad TOML, an unknown field, a negative or zero limit,
a weight that is not a positive number, an `admin` that is not true or false, a key two tenants claim
(`load_tenants` raises `SystemExit`).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servicekit.config import env_default, env_name

DEFAULT_MAX_QUEUE_S = 60.0
# How long a request's concurrency slot (and a resume's claim) outlives its last renewal in Redis; the
# orchestrator renews it while the request runs (orchestrator/limits.py), `--tenant-lease` changes it.
LEASE_S = 30.0
ANONYMOUS = ""                       # the tenant of a caller on a service with no keys at all
LIMIT_FIELDS = ("max_concurrent", "requests_per_minute", "tokens_per_minute")
FIELDS = ("keys", "weight", *LIMIT_FIELDS, "max_queue_s", "admin")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class Tenant:
    """One tenant: its name, keys, fair-share weight and limits (None: no limit)."""

    name: str
    keys: tuple[str, ...] = ()
    weight: float = 1.0
    max_concurrent: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_queue_s: float = DEFAULT_MAX_QUEUE_S
    admin: bool = False               # may read every tenant's request records
    own: bool = False                 # a key of the plain key file: the stack's own (may name a tenant)

    @property
    def limited(self) -> bool:
        return any(getattr(self, name) is not None for name in LIMIT_FIELDS)


NO_TENANT = Tenant(ANONYMOUS)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def key_tenant_name(key: str) -> str:
    return "key-" + _digest(key).hex()[:8]


@dataclass
class Tenants:
    """Every tenant, found by key or name."""

    tenants: dict[str, Tenant] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._by_digest = {_digest(key): tenant for tenant in self.tenants.values() for key in tenant.keys}

    def __bool__(self) -> bool:
        return bool(self.tenants)

    @property
    def keys(self) -> tuple[str, ...]:
        """Every accepted key, the stack's own first (the first is the one a service presents)."""
        ordered = sorted(self.tenants.values(), key=lambda t: not t.own)
        return tuple(key for tenant in ordered for key in tenant.keys)

    def of_key(self, key: str | None) -> Tenant | None:
        """The tenant `key` belongs to (compared by digest, in constant time per key), else None."""
        if key is None:
            return None
        given = _digest(key)
        found = None
        for digest, tenant in self._by_digest.items():
            if hmac.compare_digest(given, digest):
                found = tenant
        return found

    def named(self, name: str) -> Tenant | None:
        return self.tenants.get(name)

    def resolve(self, key: str | None, claimed: str | None) -> Tenant:
        """The tenant a call is for: the key's own tenant, or, when the key is the stack's own and the call
        names a known tenant (`claimed`), that one. No tenants configured: `NO_TENANT`."""
        tenant = self.of_key(key)
        if tenant is None:
            return Tenant(claimed) if claimed and not self.tenants and NAME_PATTERN.match(claimed) else NO_TENANT
        if tenant.own and claimed and claimed in self.tenants:
            return self.tenants[claimed]
        return tenant


class TenantsFileError(ValueError):
    """What is wrong with a tenants file, with the line it is on (0: unknown)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(message)
        self.line = line


def _line_of(text: str, name: str | None, key: str | None = None, value: str | None = None) -> int:
    """The 1-based line of tenant `name`'s table header, or of its `key = ...` line, or the first line in
    that table holding `value`; 0 when not found."""
    lines = text.splitlines()
    header = re.compile(r"^\s*\[\s*tenants\s*\.\s*[\"']?" + re.escape(name or "") + r"[\"']?\s*\]")
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return 0
    if key is None and value is None:
        return start + 1
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.lstrip().startswith("["):
            break
        if key is not None and re.match(r"^\s*[\"']?" + re.escape(key) + r"[\"']?\s*=", line):
            return i + 1
        if value is not None and value in line:
            return i + 1
    return start + 1


def _number(raw: Any, what: str, integer: bool) -> float | int:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or (integer and not isinstance(raw, int)):
        raise ValueError(f"{what} must be {'an integer' if integer else 'a number'}, got {raw!r}")
    if not math.isfinite(raw) or raw <= 0:
        raise ValueError(f"{what} must be positive, got {raw!r}")
    return raw


def _tenant(name: str, table: Any, text: str) -> Tenant:
    if not isinstance(table, dict):
        raise TenantsFileError(f"tenants.{name} must be a table", _line_of(text, name))
    if not NAME_PATTERN.match(name):
        raise TenantsFileError(f"tenant name {name!r}: use 1-64 letters, digits, '.', '_' or '-'",
                               _line_of(text, name))
    for key in table:
        if key not in FIELDS:
            raise TenantsFileError(f"tenants.{name}: unknown field {key!r} (known: {', '.join(FIELDS)})",
                                   _line_of(text, name, key))
    keys = table.get("keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) and k and len(k.split()) == 1 and k == k.strip()
                                             for k in keys):
        raise TenantsFileError(f"tenants.{name}.keys must be a list of keys without whitespace",
                               _line_of(text, name, "keys"))
    values: dict[str, Any] = {}
    for key, integer in (("weight", False), ("max_concurrent", True), ("requests_per_minute", True),
                         ("tokens_per_minute", True), ("max_queue_s", False)):
        if key in table:
            try:
                values[key] = _number(table[key], f"tenants.{name}.{key}", integer)
            except ValueError as exc:
                raise TenantsFileError(str(exc), _line_of(text, name, key)) from None
    if "admin" in table:
        if not isinstance(table["admin"], bool):
            raise TenantsFileError(f"tenants.{name}.admin must be true or false, got {table['admin']!r}",
                                   _line_of(text, name, "admin"))
        values["admin"] = table["admin"]
    if "weight" in values:
        values["weight"] = float(values["weight"])
    if "max_queue_s" in values:
        values["max_queue_s"] = float(values["max_queue_s"])
    return Tenant(name, tuple(keys), **values)


def parse_tenants(text: str, own_keys: Iterable[str] = ()) -> Tenants:
    """The tenants of a file's `text`, plus one tenant per key of `own_keys` that none lists.
    Raises `TenantsFileError` (with the line) for bad input."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise TenantsFileError(f"not valid TOML: {exc}", int(match.group(1)) if match else 0) from None
    unknown = [key for key in data if key != "tenants"]
    if unknown:
        raise TenantsFileError(f"unknown top-level field {unknown[0]!r} (tables go under [tenants.NAME])",
                               _top_line(text, unknown[0]))
    tables = data.get("tenants", {})
    if not isinstance(tables, dict):
        raise TenantsFileError("'tenants' must be a table of tables ([tenants.NAME])", _top_line(text, "tenants"))
    tenants: dict[str, Tenant] = {}
    owner: dict[str, str] = {}
    for name, table in tables.items():
        tenant = _tenant(name, table, text)
        for key in tenant.keys:
            if key in owner:
                raise TenantsFileError(f"a key of tenants.{name} is also tenants.{owner[key]}'s: a key belongs "
                                       f"to one tenant", _line_of(text, name, value=key))
            owner[key] = name
        tenants[name] = tenant
    for key in own_keys:
        if key in owner:
            listed = tenants[owner[key]]
            tenants[listed.name] = Tenant(**{**listed.__dict__, "own": True})
        else:
            tenants[key_tenant_name(key)] = Tenant(key_tenant_name(key), (key,), own=True)
    return Tenants(tenants)


def _top_line(text: str, key: str) -> int:
    for i, line in enumerate(text.splitlines()):
        if re.match(r"^\s*\[?\s*" + re.escape(key) + r"\b", line):
            return i + 1
    return 0


def load_tenants(path: str | Path | None, own_keys: Iterable[str] = ()) -> Tenants:
    """The tenants of the file at `path` (none: only `own_keys`, each a tenant of its own).
    Bad input is a one-line `SystemExit`: `error: FILE line N: what is wrong`."""
    if not path:
        return parse_tenants("", own_keys)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"error: cannot read the tenants file {path}: {exc}") from None
    try:
        return parse_tenants(text, own_keys)
    except TenantsFileError as exc:
        where = f" line {exc.line}" if exc.line else ""
        raise SystemExit(f"error: tenants file {path}{where}: {' '.join(str(exc).split())}") from None


def add_tenants_args(parser: argparse.ArgumentParser, service: str) -> None:
    """`--tenants FILE` (env `STREAMRAG_<SERVICE>_TENANTS`)."""
    parser.add_argument("--tenants", default=env_default(service, "tenants", None),
                        help=f"tenants file (TOML: keys, weight, limits per tenant; "
                             f"env {env_name(service, 'tenants')})")


def tenant_summary(tenants: Mapping[str, Tenant]) -> str:
    """`acme (weight 2, 120 rpm), key-1a2b3c4d` — for start-up lines, never with keys."""
    parts = []
    for tenant in tenants.values():
        limits = [f"{tenant.max_concurrent} concurrent" if tenant.max_concurrent else "",
                  f"{tenant.requests_per_minute} rpm" if tenant.requests_per_minute else "",
                  f"{tenant.tokens_per_minute} tpm" if tenant.tokens_per_minute else "",
                  "admin" if tenant.admin else ""]
        extra = ", ".join([f"weight {tenant.weight:g}", *filter(None, limits)]) if not tenant.own else ""
        parts.append(f"{tenant.name} ({extra})" if extra else tenant.name)
    return ", ".join(parts)
