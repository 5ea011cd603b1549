"""A real DNS server on loopback (dnslib, UDP) whose A records a test changes while it runs.

    with DnsServer() as dns:
        dns.set("inference.test", ["127.0.0.2", "127.0.0.3"])
        target = f"dns://127.0.0.1:{dns.port}/inference.test:{port}"

A name with no addresses set (or set to []) answers NXDOMAIN; a known name asked for another
record type answers with no records.
"""

from __future__ import annotations

import threading

from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from tests.support.redis_server import free_port


class DnsServer(BaseResolver):
    def __init__(self, ttl: int = 1) -> None:
        self.ttl = ttl
        self.records: dict[str, list[str]] = {}
        self.asked = 0
        self._lock = threading.Lock()
        self.port = free_port()
        self.server = DNSServer(self, address="127.0.0.1", port=self.port,
                                logger=DNSLogger(log="-request,-reply,-truncated,-error", prefix=False))
        self.server.start_thread()

    def set(self, name: str, ips: list[str]) -> None:
        with self._lock:
            self.records[name.rstrip(".")] = list(ips)

    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).rstrip(".")
        with self._lock:
            self.asked += 1
            ips = list(self.records.get(name, []))
        if not ips:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype == QTYPE.A:
            for ip in ips:
                reply.add_answer(RR(request.q.qname, QTYPE.A, ttl=self.ttl, rdata=A(ip)))
        return reply

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> DnsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
