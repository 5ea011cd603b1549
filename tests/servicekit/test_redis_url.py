"""servicekit.redis_url: the two URL forms, the errors of bad ones, and the start-up check of a
Sentinel URL (the orchestrator and `streamrag up` refuse, in one line, Sentinels none of which answers)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servicekit.redis_url import RedisUrlError, check_reachable, parse_redis_url, redis_client
from tests.support.redis_server import PrivateRedis, free_port
from tests.support.stack import streamrag


@pytest.mark.parametrize(("url", "sentinels", "master", "db", "password"), [
    ("redis+sentinel://127.0.0.1:26379/mymaster/0", (("127.0.0.1", 26379),), "mymaster", 0, None),
    ("redis+sentinel://a:1,b:2,c/m/3", (("a", 1), ("b", 2), ("c", 26379)), "m", 3, None),
    ("redis+sentinel://:secret@redis-sentinel:26379/streamrag", (("redis-sentinel", 26379),), "streamrag", 0, "secret"),
    ("redis+sentinel://[::1]:5000/m/1/", (("::1", 5000),), "m", 1, None),
])
def test_sentinel_urls_name_their_sentinels_master_and_database(url, sentinels, master, db, password):
    address = parse_redis_url(url)
    assert (address.sentinels, address.master, address.db, address.password) == (sentinels, master, db, password)
    assert address.replicated


def test_a_plain_url_is_redis_pys_own():
    address = parse_redis_url("redis://127.0.0.1:6379/2")
    assert not address.replicated and address.url == "redis://127.0.0.1:6379/2"


@pytest.mark.parametrize(("url", "says"), [
    ("127.0.0.1:6379", "expected redis://HOST:PORT/DB or redis+sentinel://"),
    ("http://127.0.0.1:6379/0", "expected redis://"),
    ("redis://127.0.0.1:99999/0", "Port"),
    ("redis+sentinel:///m/0", "no Sentinel address"),
    ("redis+sentinel://a:1", "no master name"),
    ("redis+sentinel://a:1/", "no master name"),
    ("redis+sentinel://a:port/m", "'a:port' has no valid port"),
    ("redis+sentinel://a:1,/m", "'' is not HOST:PORT"),
    ("redis+sentinel://a:1/m/zero", "the database 'zero' is not a number"),
    ("redis+sentinel://a:1/m/0/extra", "expected /MASTER/DB"),
    ("redis+sentinel://a:1/m/0?x=1", "no query"),
])
def test_a_bad_url_gets_one_line_naming_it_and_what_is_wrong(url, says):
    with pytest.raises(RedisUrlError) as caught:
        parse_redis_url(url)
    message = str(caught.value)
    assert repr(url) in message and says in message and "\n" not in message


def test_no_reachable_sentinel_is_an_error_at_the_check_and_a_plain_redis_need_not_be_up():
    ports = free_port(), free_port()
    url = f"redis+sentinel://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/streamrag/0"
    with pytest.raises(RedisUrlError, match="no Sentinel reachable") as caught:
        check_reachable(url, timeout_s=1)
    assert all(str(port) in str(caught.value) for port in ports) and "\n" not in str(caught.value)
    assert not check_reachable(f"redis://127.0.0.1:{ports[0]}/0").replicated


def test_a_server_that_is_no_sentinel_is_refused(tmp_path):
    server = PrivateRedis(tmp_path)
    try:
        with pytest.raises(RedisUrlError, match="no Sentinel reachable"):
            check_reachable(f"redis+sentinel://127.0.0.1:{server.port}/streamrag/0", timeout_s=1)
    finally:
        server.stop()


def test_the_orchestrator_refuses_to_start_on_unreachable_sentinels_in_one_line():
    url = f"redis+sentinel://127.0.0.1:{free_port()}/streamrag/0"
    run = subprocess.run([sys.executable, "-m", "orchestrator.server", "--port", "0", "--metrics-port", "-1",
                          "--redis", url, "--anns", "", "--crawler", ""],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert run.stderr.startswith("error: --redis:") and "no Sentinel reachable" in run.stderr


def test_up_refuses_unreachable_sentinels_in_one_line(run_dir):
    url = f"redis+sentinel://127.0.0.1:{free_port()}/streamrag/0"
    run = streamrag("up", "--run-dir", str(run_dir), "--free-ports", "--redis", url, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0, run.stderr
    assert run.stderr.startswith("error: --redis:") and "no Sentinel reachable" in run.stderr


def test_a_plain_client_is_made_from_the_url(tmp_path):
    server = PrivateRedis(tmp_path)
    client = redis_client(server.url, sync=True)
    try:
        assert client.ping() and client.set("k", "v") and client.get("k") == "v"
    finally:
        client.close()
        server.stop()
