"""Which URLs the crawler may fetch.

An allow-list of hosts (`host` matches any port, `host:port` only that port), HTTP(S) only,
no credentials in URLs. Addresses are checked twice:

- in the URL (`UrlPolicy.refusal`): an IP literal in a link-local, multicast or unspecified
  range is refused even when listed (cloud metadata endpoints live there); a listed loopback
  or private literal, such as the local corpus server `127.0.0.1:8765`, is allowed because
  it was listed explicitly;
- when a host name is resolved (`GuardedResolver`, plugged into the crawler's HTTP client):
  link-local, multicast and unspecified addresses are refused, and so are loopback, private
  and reserved ones unless the name is one of `internal_names` (by default the hosts of the
  server's own start URLs, e.g. a compose service name). An allowed public name that
  suddenly resolves to an internal address is refused.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UrlRefused(ValueError):
    """A URL (or the address behind it) that the crawler must not fetch."""


@dataclass(frozen=True)
class HostRule:
    host: str                              # lower case; IPv6 without brackets
    port: int | None                       # None: any port

    @classmethod
    def parse(cls, entry: str) -> HostRule:
        entry = entry.strip().lower()
        parts = urlsplit(entry if "//" in entry else f"//{entry}")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"bad allowed host {entry!r}: {exc}") from None
        if not parts.hostname or parts.username is not None or parts.path not in ("", "/"):
            raise ValueError(f"bad allowed host {entry!r}: give a host name or address, optionally with :port")
        return cls(parts.hostname, port)

    def matches(self, host: str, port: int) -> bool:
        return host == self.host and (self.port is None or self.port == port)


def ip_literal(host: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def never_fetchable(address: IPAddress) -> bool:
    """Link-local, multicast or unspecified: refused whatever the allow-list says."""
    return address.is_link_local or address.is_multicast or address.is_unspecified


def is_internal(address: IPAddress) -> bool:
    """Loopback, private, reserved, shared (CGNAT) ...: anything not globally routable."""
    return not address.is_global or never_fetchable(address)


class UrlPolicy:
    """The crawler's allow-list; `refusal(url)` says why a URL is refused (None: allowed)."""

    def __init__(self, allowed_hosts: Iterable[str], internal_names: Iterable[str] = ()) -> None:
        self.rules = tuple(HostRule.parse(h) for h in allowed_hosts)
        if not self.rules:
            raise ValueError("the crawler needs at least one allowed host")
        self.internal_names = frozenset(HostRule.parse(h).host for h in internal_names)

    @classmethod
    def for_start_urls(cls, start_urls: Iterable[str], allowed_hosts: Iterable[str] | None = None) -> UrlPolicy:
        """Allowed hosts default to the start URLs' `host:port`; every start URL must be allowed."""
        start_urls = list(start_urls)
        hosts = []
        for url in start_urls:
            try:
                parts = urlsplit(url)
                hosts.append((parts.hostname, parts.port or DEFAULT_PORTS[parts.scheme.lower()]))
            except (KeyError, ValueError):
                raise UrlRefused(f"start URL {url!r} refused: not an http(s) URL") from None
            if not parts.hostname:
                raise UrlRefused(f"start URL {url!r} refused: no host")
        default = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts]
        policy = cls(allowed_hosts if allowed_hosts else default, internal_names=[h for h, _ in hosts])
        for url in start_urls:
            if reason := policy.refusal(url):
                raise UrlRefused(f"start URL {url!r} refused: {reason}")
        return policy

    def refusal(self, url: str) -> str | None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            return f"malformed URL ({exc})"
        if parts.scheme.lower() not in SCHEMES:
            return f"scheme {parts.scheme or '(none)'!r} is not http or https"
        if parts.username is not None or parts.password is not None:
            return "credentials in URLs are refused"
        host = (parts.hostname or "").lower()
        if not host:
            return "no host"
        port = port or DEFAULT_PORTS[parts.scheme.lower()]
        if not any(rule.matches(host, port) for rule in self.rules):
            return f"host {host}:{port} is not on the allow-list"
        address = ip_literal(host)
        if address is not None and never_fetchable(address):
            return f"address {address} is link-local, multicast or unspecified"
        return None

    def allows(self, url: str) -> bool:
        return self.refusal(url) is None

    def check(self, url: str) -> None:
        if reason := self.refusal(url):
            raise UrlRefused(f"{url}: {reason}")

    def address_refusal(self, host: str, address: str) -> str | None:
        """Why `host` may not be reached at the resolved `address` (None: it may)."""
        ip = ip_literal(address.split("%", 1)[0])
        if ip is None:
            return f"{host} resolved to a non-address {address!r}"
        if never_fetchable(ip):
            return f"{host} resolves to {ip}, a link-local, multicast or unspecified address"
        if is_internal(ip) and host.lower() not in self.internal_names:
            return f"{host} resolves to the internal address {ip}"
        return None


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that refuses names resolving to addresses the policy forbids."""

    def __init__(self, policy: UrlPolicy, resolver: AbstractResolver | None = None) -> None:
        self.policy = policy
        self._resolver = resolver or DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._resolver.resolve(host, port, family)
        for result in results:
            if reason := self.policy.address_refusal(host, result["host"]):
                raise OSError(reason)
        return results

    async def close(self) -> None:
        await self._resolver.close()
