"""The corpus web server: serves a directory, refuses traversal, draws per-request latency."""

from __future__ import annotations

import argparse
import http.client
import random
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from retriever_svc.corpus.web_server import (
    LATENCY_PROFILES,
    CorpusServer,
    add_serve_corpus_args,
    is_traversal,
    latency_profile,
    run_serve_corpus,
)
from tests.retriever import http_get

REPO = Path(__file__).resolve().parents[2]


def test_serves_the_site_on_loopback_as_utf8_html(corpus: CorpusServer) -> None:
    assert corpus.url.startswith("http://127.0.0.1:")
    status, content_type, body = http_get(corpus, "/files.html")
    assert status == 200
    assert content_type == "text/html; charset=utf-8"
    assert b"Reading and Writing Files" in body
    assert http_get(corpus, "/io/buffering.html")[0] == 200


def test_missing_pages_and_directory_listings_are_404(corpus: CorpusServer) -> None:
    assert http_get(corpus, "/nope.html")[0] == 404
    assert http_get(corpus, "/io/")[0] == 404          # a directory without index.html is not listed


@pytest.mark.parametrize("path", [
    "/../../../../etc/passwd",
    "/io/../../etc/passwd",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/io/..%2f..%2f..%2fetc/passwd",
    "/..\\..\\etc\\passwd",
    "/files.html%00.txt",
])
def test_path_traversal_is_refused(corpus: CorpusServer, path: str) -> None:
    status, _, body = http_get(corpus, path)
    assert status == 403
    assert b"root:" not in body
    assert is_traversal(path)


def test_ordinary_paths_are_not_traversal() -> None:
    for path in ["/", "/index.html", "/io/buffering.html?x=..", "/a..b.html", "/io/./buffering.html"]:
        assert not is_traversal(path), path


def test_every_request_is_recorded_with_its_status(corpus: CorpusServer) -> None:
    http_get(corpus, "/index.html")
    http_get(corpus, "/nope.html")
    http_get(corpus, "/../etc/passwd")
    assert [(r.path, r.status) for r in corpus.requests] == [
        ("/index.html", 200), ("/nope.html", 404), ("/../etc/passwd", 403)]
    assert corpus.request_count == 3


def test_web_latency_has_a_700ms_median_and_a_long_capped_tail() -> None:
    web = LATENCY_PROFILES["web"]
    rng = random.Random(7)
    draws = sorted(web.sample(rng) for _ in range(20_000))
    assert statistics.median(draws) == pytest.approx(0.7, rel=0.05)
    p90 = draws[int(0.9 * len(draws))]
    assert p90 == pytest.approx(0.7 * 3.60, rel=0.1)   # lognormal sigma 1: p90 = median * e^1.2816
    assert draws[0] < 0.05 and draws[-1] <= web.cap_s
    assert max(LATENCY_PROFILES["web"].sample(rng) for _ in range(5)) > 0


def test_latency_profiles_by_name_or_seconds() -> None:
    rng = random.Random(0)
    assert latency_profile("none").sample(rng) == 0.0
    assert latency_profile("0.25").sample(rng) == 0.25
    assert 0 < latency_profile("lan").sample(rng) <= 0.5
    with pytest.raises(ValueError, match="unknown latency profile"):
        latency_profile("slow")
    with pytest.raises(ValueError):
        latency_profile("-1")


def test_latency_draws_are_seedable(tiny_corpus: Path) -> None:
    first = CorpusServer(tiny_corpus, latency="web", seed=42)
    second = CorpusServer(tiny_corpus, latency="web", seed=42)
    try:
        assert [first.draw_delay("/") for _ in range(5)] == [second.draw_delay("/") for _ in range(5)]
    finally:
        first.stop()
        second.stop()


def test_constant_latency_delays_each_answer(tiny_corpus: Path) -> None:
    with CorpusServer(tiny_corpus, latency="0.05") as server:
        assert http_get(server, "/index.html")[0] == 200
        assert server.requests[0].delay_s == 0.05


def test_cli_flags_and_a_bad_root(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_serve_corpus_args(parser)
    args = parser.parse_args([])
    assert (args.port, args.host, args.latency, str(args.root)) == (8765, "127.0.0.1", "none",
                                                                    "/usr/share/doc/python3.11/html")
    assert run_serve_corpus(parser.parse_args(["--root", str(tmp_path / "missing"), "--port", "0"])) == 2
    assert run_serve_corpus(parser.parse_args(["--root", str(tmp_path), "--port", "0", "--latency", "x"])) == 2


def test_serve_corpus_prints_its_url_and_stops_on_sigterm(tiny_corpus: Path) -> None:
    script = ("import argparse, sys\n"
              "from retriever_svc.corpus.web_server import add_serve_corpus_args, run_serve_corpus\n"
              "p = argparse.ArgumentParser(); add_serve_corpus_args(p)\n"
              "sys.exit(run_serve_corpus(p.parse_args(sys.argv[1:])))\n")
    process = subprocess.Popen([sys.executable, "-c", script, "--root", str(tiny_corpus), "--port", "0",
                                "--latency", "web", "--latency-seed", "1"],
                               cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "latency web" in line
        url = line.split(" on ", 1)[1].split()[0]
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("GET", "/dicts.html")
        assert connection.getresponse().status == 200
        connection.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
