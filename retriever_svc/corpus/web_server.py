"""`streamrag serve corpus`: a static HTML site on loopback for the crawler to fetch.

A threaded stdlib HTTP server over one directory (default: the Python 3.11 docs from
Debian's `python3.11-doc`). Every request can be slowed by a delay drawn from a named
latency profile, so a crawl of a local site shows web-like gaps between pages:

    none   no delay
    lan    lognormal, median 20 ms, sigma 0.5, capped at 0.5 s
    web    lognormal, median 0.7 s, sigma 1.0, capped at 30 s (the Stream2LLM crawler's
           published inter-chunk median is 700 ms, spread from tens of ms to over 30 s)

A plain number of seconds (e.g. `--latency 0.25`) gives a constant delay. The server
refuses path traversal (any `..` segment: 403), lists no directories, and records every
request (path, status, delay) so tests can count what reached it.

It also answers `GET /search?q=...&limit=N` with the site's own search (`site_search`: BM25
over the root's pages, built when the server starts; JSON; a bad request is a 400 with a
JSON error), which the crawler takes its start URLs from. `--no-search` turns it off (404).

Only the standard library is imported here: `add_serve_corpus_args` is cheap for the CLI.
"""

from __future__ import annotations

import argparse
import json
import math
import posixpath
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from retriever_svc.corpus.site_search import SiteSearch

DEFAULT_ROOT = Path("/usr/share/doc/python3.11/html")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765  # servicekit.config.DEFAULT_PORTS["corpus"]
SEARCH_PATH = "/search"


@dataclass(frozen=True)
class LatencyProfile:
    """Per-request delay: lognormal with this median and shape, capped (sigma 0: constant)."""

    name: str
    median_s: float
    sigma: float
    cap_s: float

    def sample(self, rng: random.Random) -> float:
        if self.median_s <= 0:
            return 0.0
        if self.sigma <= 0:
            return min(self.median_s, self.cap_s)
        return min(rng.lognormvariate(math.log(self.median_s), self.sigma), self.cap_s)


LATENCY_PROFILES: dict[str, LatencyProfile] = {
    "none": LatencyProfile("none", 0.0, 0.0, 0.0),
    "lan": LatencyProfile("lan", 0.02, 0.5, 0.5),
    "web": LatencyProfile("web", 0.7, 1.0, 30.0),
}


def latency_profile(spec: str) -> LatencyProfile:
    """A profile by name, or a constant delay from a number of seconds."""
    if spec in LATENCY_PROFILES:
        return LATENCY_PROFILES[spec]
    try:
        seconds = float(spec)
    except ValueError:
        names = ", ".join(LATENCY_PROFILES)
        raise ValueError(f"unknown latency profile {spec!r}: use one of {names} or a number of seconds") from None
    if not 0 <= seconds <= 60:
        raise ValueError(f"a constant latency must be in [0, 60] seconds, got {seconds}")
    return LatencyProfile(f"constant {seconds:g}s", seconds, 0.0, seconds)


@dataclass
class RequestRecord:
    """One request as it reached the server; `status` is 0 until the response is sent."""

    path: str
    at: float                              # time.monotonic() when the request arrived
    delay_s: float = 0.0
    status: int = 0


def is_traversal(raw_path: str) -> bool:
    """True when the URL path climbs out of the root (a `..` segment, raw or %-encoded, or a NUL)."""
    path = unquote(urlsplit(raw_path).path)
    if "\x00" in path:
        return True
    segments = path.replace("\\", "/").split("/")
    return ".." in segments or not posixpath.normpath("/" + path).startswith("/")


class _CorpusHandler(SimpleHTTPRequestHandler):
    server: _CorpusHTTPServer
    record: RequestRecord | None = None

    def do_GET(self) -> None:
        if self._admit():
            if urlsplit(self.path).path == SEARCH_PATH:
                self._search()
            else:
                super().do_GET()

    def do_HEAD(self) -> None:
        if self._admit():
            super().do_HEAD()

    def _search(self) -> None:
        from retriever_svc.corpus.site_search import SearchRequestError, parse_search_request

        index = self.server.corpus.search_index
        if index is None:
            self.send_error(HTTPStatus.NOT_FOUND, "this corpus server has no search")
            return
        try:
            query, limit = parse_search_request(urlsplit(self.path).query)
        except SearchRequestError as exc:
            self._send_json(HTTPStatus.BAD_REQUEST, json.dumps({"error": str(exc)}).encode("utf-8"))
            return
        self._send_json(HTTPStatus.OK, index.search(query, limit).to_json())

    def _send_json(self, status: HTTPStatus, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_response(self, code: int, message: str | None = None) -> None:
        if self.record is not None:
            self.record.status = int(code)
        super().send_response(code, message)

    def _admit(self) -> bool:
        """Record the request, refuse traversal, then wait out the drawn latency."""
        corpus = self.server.corpus
        self.record = RequestRecord(self.path, time.monotonic())
        corpus.add_record(self.record)
        if is_traversal(self.path):
            self.send_error(HTTPStatus.FORBIDDEN, "path traversal refused")
            return False
        self.record.delay_s = corpus.draw_delay(self.path)
        if self.record.delay_s and corpus.stopping.wait(self.record.delay_s):
            self.close_connection = True   # shutting down: drop the request unanswered
            return False
        return True

    def guess_type(self, path) -> str:
        kind = super().guess_type(path)
        return f"{kind}; charset=utf-8" if kind == "text/html" else kind   # the docs are UTF-8

    def list_directory(self, path):
        self.send_error(HTTPStatus.NOT_FOUND, "no directory listings")
        return None

    def log_message(self, format: str, *args) -> None:
        pass


class _CorpusHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    corpus: CorpusServer

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):   # a crawler hanging up early is normal
            super().handle_error(request, client_address)


class CorpusServer:
    """Serves `root` over HTTP on `host:port` (0: a free port) with a latency profile.

    `start()` builds the search index (unless `search=False`), then serves from a background
    thread and returns the base URL; `stop()` ends it. `requests` lists what arrived, in order.
    """

    def __init__(self, root: Path | str = DEFAULT_ROOT, host: str = DEFAULT_HOST, port: int = 0,
                 latency: LatencyProfile | str = "none", seed: int | None = None, search: bool = True) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"corpus root {self.root} is not a directory")
        self.latency = latency_profile(latency) if isinstance(latency, str) else latency
        self.search = search
        self.search_index: SiteSearch | None = None
        self.search_build_s = 0.0
        self.stopping = threading.Event()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._requests: list[RequestRecord] = []
        self._thread: threading.Thread | None = None
        self._httpd = _CorpusHTTPServer((host, port), partial(_CorpusHandler, directory=str(self.root)))
        self._httpd.corpus = self

    @property
    def host(self) -> str:
        return self._httpd.server_address[0]

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def index_url(self) -> str:
        return self.url + "index.html"

    @property
    def search_url(self) -> str:
        return self.url + SEARCH_PATH.lstrip("/")

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._requests)

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self._requests)

    def draw_delay(self, path: str) -> float:
        """The delay before answering `path` (every path draws from the same profile)."""
        with self._lock:
            return self.latency.sample(self._rng)

    def add_record(self, request: RequestRecord) -> None:
        with self._lock:
            self._requests.append(request)

    def start(self) -> str:
        if self.search and self.search_index is None:
            from retriever_svc.corpus.site_search import SiteSearch

            started = time.monotonic()
            self.search_index = SiteSearch.build(self.root)
            self.search_build_s = time.monotonic() - started
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="corpus-server",
                                        daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

    def __enter__(self) -> CorpusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def add_serve_corpus_args(parser: argparse.ArgumentParser) -> None:
    """Flags of `streamrag serve corpus`."""
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=f"site directory (default {DEFAULT_ROOT})")
    parser.add_argument("--host", default=DEFAULT_HOST, help="listen address (default loopback)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT}; 0: free)")
    parser.add_argument("--latency", default="none",
                        help=f"per-request delay: {', '.join(LATENCY_PROFILES)} or seconds (default none)")
    parser.add_argument("--latency-seed", type=int, default=None, help="seed the delay draws (reproducible runs)")
    parser.add_argument("--no-search", dest="search", action="store_false",
                        help=f"do not serve {SEARCH_PATH} (the site search the crawler starts from)")


def run_serve_corpus(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; exit status 2 on a bad root, port or profile."""
    try:
        server = CorpusServer(args.root, args.host, args.port, args.latency, args.latency_seed,
                              search=args.search)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", flush=True)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    server.start()
    search = (f", search {server.search_url}: {server.search_index.page_count} pages indexed in "
              f"{server.search_build_s:.1f} s" if server.search_index is not None else "")
    print(f"corpus {server.root} on {server.url} (latency {server.latency.name}{search})", flush=True)
    try:
        done.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    import sys

    from servicekit.config import run_command

    sys.exit(run_command("python -m retriever_svc.corpus.web_server", add_serve_corpus_args, run_serve_corpus))
