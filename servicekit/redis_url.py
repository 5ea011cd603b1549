"""Redis addresses, parsed and dialed one way by every service: one Redis or a Sentinel-watched set.

Two forms, accepted wherever a service takes a Redis (`--redis`, the health check):

    redis://[USER:PASSWORD@]HOST:PORT/DB          one server (also rediss://, unix://): redis-py's own URL
    redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]
                                                  the primary of MASTER, as the Sentinels at those
                                                  addresses name it now (port default 26379, DB 0)

`redis_client(url)` gives a `redis.asyncio.Redis` (`sync=True`: a `redis.Redis`) for either. A
Sentinel client asks the Sentinels for the primary on every new connection and drops a connection
whose server turned replica, so it follows a failover; its commands are retried with backoff
(`failover_retry`) on ConnectionError, TimeoutError and ReadOnlyError while the Sentinels promote a
replica. A plain client keeps redis-py's single immediate retry. The password, when given, is the
data servers'; the Sentinels are dialed without one.

`check_reachable(url)` is the start-up check: for a Sentinel URL at least one Sentinel must answer
and know MASTER (a plain server need not be up yet: its users buffer or retry). Bad URLs and
failed checks raise `RedisUrlError`, whose message is one line naming the URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

SENTINEL_SCHEME = "redis+sentinel"
PLAIN_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_PORT = 26379
FORMS = "redis://HOST:PORT/DB or redis+sentinel://HOST:PORT[,HOST:PORT]/MASTER/DB"
# A failover on Sentinel's usual settings (down-after a few seconds, then an election) is over in
# about 5-15 s: the retries back off 0.1 s, 0.2 s, ... up to 2 s apart, 8 of them (about 12 s of
# sleeping, plus each try's connect timeout).
FAILOVER_RETRIES = 8
FAILOVER_BACKOFF_BASE_S = 0.1
FAILOVER_BACKOFF_CAP_S = 2.0


class RedisUrlError(ValueError):
    """A Redis URL that cannot be parsed, or whose Sentinels cannot be reached (a one-line message)."""


@dataclass(frozen=True)
class RedisAddress:
    """A parsed Redis URL: `sentinels` empty for a plain one (then `url` is what redis-py dials)."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None

    @property
    def replicated(self) -> bool:
        """True for a Sentinel set: a primary with replicas that can take its place."""
        return bool(self.sentinels)

    def sentinel_list(self) -> str:
        return ", ".join(f"{host}:{port}" for host, port in self.sentinels)


def parse_redis_url(url: str) -> RedisAddress:
    """The address `url` names; `RedisUrlError` saying what is wrong with it otherwise."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme in PLAIN_SCHEMES:
        from redis.connection import parse_url

        try:
            parse_url(url)
        except ValueError as exc:
            raise RedisUrlError(f"Redis URL {url!r}: {exc}") from None
        return RedisAddress(url)
    if scheme != SENTINEL_SCHEME:
        raise RedisUrlError(f"Redis URL {url!r}: expected {FORMS}")
    parts = urlsplit(url)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    if not hostlist:
        raise RedisUrlError(f"Redis URL {url!r}: no Sentinel address (expected {FORMS})")
    sentinels = tuple(_host_port(url, item) for item in hostlist.split(","))
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if path and path[-1] == "":
        path.pop()
    if not path or not path[0]:
        raise RedisUrlError(f"Redis URL {url!r}: no master name (expected {FORMS})")
    if len(path) > 2:
        raise RedisUrlError(f"Redis URL {url!r}: expected /MASTER/DB after the Sentinels, got {parts.path!r}")
    db = path[1] if len(path) == 2 else "0"
    if not db.isdigit():
        raise RedisUrlError(f"Redis URL {url!r}: the database {db!r} is not a number")
    if parts.query or parts.fragment:
        raise RedisUrlError(f"Redis URL {url!r}: a Sentinel URL takes no query or fragment")
    return RedisAddress(url, sentinels, path[0], int(db), unquote(username) or None,
                        unquote(password) if userinfo and ":" in userinfo else None)


def _host_port(url: str, item: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):                       # [::1]:26379
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") or not rest else None
    else:
        host, _, port = item.partition(":")
    if not host or port is None:
        raise RedisUrlError(f"Redis URL {url!r}: {item!r} is not HOST:PORT (expected {FORMS})")
    if not port:
        return host, SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisUrlError(f"Redis URL {url!r}: {item!r} has no valid port")
    return host, int(port)


def failover_retry(sync: bool = False) -> Any:
    """redis-py's `Retry` that rides out a failover: exponential backoff on ConnectionError,
    TimeoutError and ReadOnlyError (a primary turned replica)."""
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError, ReadOnlyError, TimeoutError

    backoff = ExponentialBackoff(cap=FAILOVER_BACKOFF_CAP_S, base=FAILOVER_BACKOFF_BASE_S)
    errors = (ConnectionError, TimeoutError, ReadOnlyError)
    return _retry_class(sync)(backoff, FAILOVER_RETRIES, supported_errors=errors)


def _retry_class(sync: bool) -> type:
    if sync:
        from redis.retry import Retry
    else:
        from redis.asyncio.retry import Retry
    return Retry


def redis_client(url: str | RedisAddress, *, sync: bool = False, timeout_s: float = 2.0,
                 decode_responses: bool = True, **kwargs: Any) -> Any:
    """A client of `url`'s Redis (its primary, for a Sentinel URL); nothing is dialed until first use.
    `aclose()` (`close()` when `sync`) closes its Sentinel connections too."""
    address = url if isinstance(url, RedisAddress) else parse_redis_url(url)
    if sync:
        import redis as module
        from redis.sentinel import Sentinel
    else:
        import redis.asyncio as module
        from redis.asyncio.sentinel import Sentinel
    options = {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s,
               "decode_responses": decode_responses, **kwargs}
    if not address.replicated:
        from redis.backoff import NoBackoff

        options.setdefault("retry", _retry_class(sync)(NoBackoff(), 1))
        return module.Redis.from_url(address.url, **options)
    options.setdefault("retry", failover_retry(sync))
    sentinel = Sentinel(list(address.sentinels),
                        sentinel_kwargs={"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s})
    client = sentinel.master_for(address.master, redis_class=_owning_class(module.Redis), db=address.db,
                                 username=address.username, password=address.password, **options)
    client.sentinel = sentinel
    return client


_OWNING: dict[type, type] = {}


def _owning_class(base: type) -> type:
    """A subclass of `base` (redis.Redis or redis.asyncio.Redis) that closes its Sentinel with itself."""
    if base not in _OWNING:
        if hasattr(base, "aclose"):
            async def aclose(self: Any, close_connection_pool: bool | None = None) -> None:
                await base.aclose(self, close_connection_pool)
                for client in self.sentinel.sentinels:
                    await client.aclose()
            methods = {"aclose": aclose}
        else:
            def close(self: Any) -> None:
                base.close(self)
                for client in self.sentinel.sentinels:
                    client.close()
            methods = {"close": close}
        _OWNING[base] = type(f"Sentinel{base.__name__}", (base,), methods)
    return _OWNING[base]


def check_reachable(url: str, timeout_s: float = 2.0) -> RedisAddress:
    """The parsed address; for a Sentinel URL, `RedisUrlError` unless a Sentinel answers and knows MASTER."""
    address = parse_redis_url(url)
    if not address.replicated:
        return address
    import redis

    reasons, known = [], False
    for host, port in address.sentinels:
        client = redis.Redis(host=host, port=port, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        try:
            known = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", address.master) is not None
        except redis.RedisError as exc:
            reasons.append(f"{host}:{port} {str(exc) or type(exc).__name__}")
            continue
        finally:
            client.close()
        if known:
            return address
    if len(reasons) == len(address.sentinels):
        raise RedisUrlError(f"Redis URL {url!r}: no Sentinel reachable ({'; '.join(reasons)})")
    raise RedisUrlError(f"Redis URL {url!r}: the Sentinels at {address.sentinel_list()} know no master "
                        f"named {address.master!r}")
