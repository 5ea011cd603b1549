"""Inference replicas found by DNS: `--inference dns:///NAME:PORT`, resolved again every few seconds.

A target is gRPC's DNS form: `dns:///NAME:PORT` asks the system's resolver (`getaddrinfo`, so
`/etc/hosts`, `resolv.conf` and its search domains, as on Kubernetes: a headless Service's name
resolves to every ready pod); `dns://SERVER[:PORT]/NAME:PORT` asks that DNS server (dnspython).
gRPC's own `dns:` resolver cannot be used here: it keeps the addresses inside one channel, and
the router needs each address as a replica of its own (its health Watch, its stats, its score).

Each address found becomes a replica (`ReplicaRouter.add_replica`, dialed at `IP:PORT` and
presenting `NAME:PORT` as its authority, so TLS checks the name the user gave). An address that
goes away is retired (`ReplicaRouter.retire_replica`): no new request is routed to it, and the
calls open on it go on or fail over as any failure does; its channel is closed `RETIRED_KEEP_S`
later (`ReplicaRouter.forget`), so replicas that come and go for days leave nothing behind. A
name that resolves to nothing retires its replicas and says so in the log and, through
`ReplicaRouter.notes`, to every request that finds no replica; a resolver that fails (timeout,
SERVFAIL) keeps the replicas last found. A static `host:port` is not a target: it stays a replica for the router's life.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.resolver

from orchestrator.router import ReplicaRouter

log = logging.getLogger(__name__)

DNS_SCHEME = "dns:"
DEFAULT_REFRESH_S = 5.0
RETIRED_KEEP_S = 600.0     # how long the calls open on a retired replica keep their channel


class ResolveFailed(Exception):
    """The resolver gave no answer (timeout, SERVFAIL): the replicas last found are kept."""


@dataclass(frozen=True)
class DnsTarget:
    """`dns:[//SERVER[:PORT]]/NAME:PORT`: NAME's addresses, dialed on PORT, asked of SERVER (None: the system)."""

    text: str
    name: str
    port: int
    server: str | None = None
    server_port: int = 53

    @classmethod
    def parse(cls, text: str) -> DnsTarget:
        rest = text[len(DNS_SCHEME):]
        authority, _, endpoint = rest[2:].partition("/") if rest.startswith("//") else ("", "", rest.lstrip("/"))
        name, _, port = endpoint.rpartition(":")
        if not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--inference {text!r}: a DNS target is dns:///NAME:PORT "
                             f"(or dns://DNS_SERVER[:PORT]/NAME:PORT), with the replicas' port")
        server, _, server_port = authority.rpartition(":") if ":" in authority else (authority, "", "53")
        if authority and (not server or not server_port.isdigit()):
            raise ValueError(f"--inference {text!r}: the DNS server must be HOST or HOST:PORT, got {authority!r}")
        return cls(text, name.strip("[]"), int(port), server.strip("[]") or None, int(server_port))

    @property
    def authority(self) -> str:
        return f"{self.name}:{self.port}"

    async def resolve(self, timeout_s: float = 3.0) -> list[str]:
        """Every `IP:PORT` (`[IPv6]:PORT`) the name has, sorted; [] when it has none (no such name, no
        record). Raises `ResolveFailed` when the resolver does not answer."""
        ips = await (self._ask_server(timeout_s) if self.server else self._ask_system(timeout_s))
        return sorted({f"[{ip}]:{self.port}" if ":" in ip else f"{ip}:{self.port}" for ip in ips})

    async def _ask_system(self, timeout_s: float) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(self.name, self.port, type=socket.SOCK_STREAM), timeout_s)
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []
            raise ResolveFailed(str(exc)) from exc
        except TimeoutError as exc:
            raise ResolveFailed(f"no answer within {timeout_s:g} s") from exc
        return [info[4][0] for info in infos]

    async def _ask_server(self, timeout_s: float) -> list[str]:
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers, resolver.port = [self.server], self.server_port
        ips: list[str] = []
        for rdtype in ("A", "AAAA"):
            try:
                answer = await resolver.resolve(self.name, rdtype, lifetime=timeout_s)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except dns.exception.DNSException as exc:
                raise ResolveFailed(f"{type(exc).__name__}: {exc}") from exc
            ips += [record.address for record in answer]
        return ips


def split_targets(inference: Sequence[str]) -> tuple[list[str], list[DnsTarget]]:
    """`--inference` values as (static addresses, DNS targets); ValueError for a malformed target."""
    static = [value for value in inference if not value.startswith(DNS_SCHEME)]
    return static, [DnsTarget.parse(value) for value in inference if value.startswith(DNS_SCHEME)]


class ReplicaDiscovery:
    """Keeps the router's replicas in step with what `targets` resolve to, every `refresh_s`."""

    def __init__(self, router: ReplicaRouter, targets: Sequence[DnsTarget], static: Sequence[str] = (),
                 refresh_s: float = DEFAULT_REFRESH_S) -> None:
        if refresh_s <= 0:
            raise ValueError(f"the DNS refresh interval must be > 0, got {refresh_s}")
        self.router, self.targets, self.refresh_s = router, list(targets), refresh_s
        self.static = frozenset(static)
        self.found: dict[str, list[str]] = {t.text: [] for t in self.targets}
        self._authority: dict[str, str] = {}     # address -> NAME:PORT it was found under
        self._task: asyncio.Task | None = None
        self._forgetting: set[asyncio.Task] = set()

    def channel_options(self, address: str) -> tuple[tuple[str, str], ...]:
        """What a channel to a found address presents as its authority (TLS checks that name)."""
        authority = self._authority.get(address)
        return (("grpc.default_authority", authority),) if authority else ()

    async def start(self) -> None:
        """Resolve every target once (before the router starts, so it waits for what was found), then keep at it."""
        await self.resolve_all()
        if self._task is None and self.targets:
            self._task = asyncio.create_task(self._resolve_forever(), name="replica-discovery")

    async def stop(self) -> None:
        tasks, self._task = [self._task, *self._forgetting], None
        for task in tasks:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def resolve_all(self) -> None:
        await asyncio.gather(*(self._resolve(target) for target in self.targets))

    async def _resolve_forever(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.resolve_all()

    async def _resolve(self, target: DnsTarget) -> None:
        try:
            addresses = await target.resolve()
        except ResolveFailed as exc:
            kept = self.found[target.text] or "none"
            log.warning("inference %s: DNS failed (%s); keeping %s", target.text, exc, kept)
            return
        self._apply(target, addresses)

    async def _forget_later(self, address: str) -> None:
        await asyncio.sleep(RETIRED_KEEP_S)
        if address not in {r.address for r in self.router.replicas}:     # not back meanwhile
            await self.router.forget(address)

    def _apply(self, target: DnsTarget, addresses: list[str]) -> None:
        before = self.found[target.text]
        if addresses == before and (addresses or target.text in self.router.notes):
            return
        self.found[target.text] = addresses
        for address in addresses:
            self._authority[address] = target.authority
            self.router.add_replica(address)
        wanted = self.static.union(*self.found.values())
        for address in set(before) - wanted:
            self.router.retire_replica(address, f"no longer in DNS for {target.text}")
            task = asyncio.ensure_future(self._forget_later(address))
            self._forgetting.add(task)
            task.add_done_callback(self._forgetting.discard)
        if addresses:
            self.router.notes.pop(target.text, None)
            log.info("inference %s: %d replica(s): %s", target.text, len(addresses), ", ".join(addresses))
        else:
            self.router.notes[target.text] = f"{target.name} resolves to no address"
            log.warning("inference %s: %s resolves to no address; asks get UNAVAILABLE until it resolves "
                        "(asked again every %g s)", target.text, target.name, self.refresh_s)
