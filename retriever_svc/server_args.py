"""Flags of `streamrag serve retriever` for every kind (no heavy imports: `--help` is instant)."""

from __future__ import annotations

import argparse
from pathlib import Path

from servicekit.auth import add_api_key_args
from servicekit.config import DEFAULT_PORTS, add_service_args, env_default
from servicekit.tls import add_tls_args

KINDS = ["anns", "crawler", "replay"]
ANNS_BACKENDS = ["diskannpy", "milvus"]
# The crawler's defaults (retriever_svc.crawler.CrawlerSettings uses these too).
SEARCH_AT_START_SITE = "auto"          # --search-url: /search on the first start URL's site
CRAWLER_SEEDS = 5
CRAWLER_MIN_RELEVANCE = 0.25           # calibrated in docs/results.md (retrieval quality)
CRAWLER_MAX_PAGES = 30
CRAWLER_MAX_DEPTH = 2


def add_retriever_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", required=True, choices=KINDS, help="which retriever to run")
    # Port/metrics defaults are the ANNS ones; server.py moves them to the crawler's when --kind crawler.
    add_service_args(parser, "anns")
    env = lambda key, default: env_default("retriever", key, default)  # noqa: E731
    anns = parser.add_argument_group("anns")
    anns.add_argument("--index", type=Path, default=env("index", None),
                      help="index directory from `streamrag index build` (default: the cache's); none: serve only the "
                           "live collections")
    anns.add_argument("--collections", type=Path, default=env("collections", None),
                      help="folder of the live collections (default: <cache>/collections)")
    anns.add_argument("--build-from", type=Path, default=env("build_from", None),
                      help="when the default index is missing, build it from this HTML tree in the background "
                           "while the live collections serve (default: refuse to start)")
    anns.add_argument("--build-commit-every", type=int, default=env("build_commit_every", None),
                      help="passages that build embeds between two commits (whole pages; default 256): a build cut "
                           "short resumes from its last commit")
    anns.add_argument("--l-schedule", default=env("l_schedule", "16,64,256"),
                      help="growing search list sizes L; the last is the final, full search")
    anns.add_argument("--beam-width", type=int, default=env("beam_width", 8))
    anns.add_argument("--backend", choices=ANNS_BACKENDS, default=env("backend", "diskannpy"),
                      help="where the vectors are searched: diskannpy (in this process) or milvus (--milvus-uri)")
    anns.add_argument("--milvus-uri", default=env("milvus_uri", ""),
                      help="Milvus to use with --backend milvus: the embedded server, Standalone or a cluster's proxy "
                           "(e.g. http://127.0.0.1:19530)")
    anns.add_argument("--milvus-index", choices=["auto", "DISKANN", "HNSW"], default=env("milvus_index", "auto"),
                      help="index Milvus builds (auto: DISKANN, HNSW on the embedded server, which lacks DiskANN)")
    anns.add_argument("--milvus-timeout", type=float, default=env("milvus_timeout", 5.0),
                      help="seconds one Milvus search may take before the retrieval ends UNAVAILABLE")
    crawler = parser.add_argument_group("crawler")
    crawler.add_argument("--start-url", action="append", default=None,
                         help="the site to crawl (default: the corpus server's index page); with --search-url none "
                              "crawls start here")
    crawler.add_argument("--allow-host", action="append", default=None,
                         help="hosts the crawler may fetch (default: the start URLs' hosts)")
    crawler.add_argument("--search-url", default=env("search_url", SEARCH_AT_START_SITE),
                         help="site search that gives each crawl its start pages (default auto: /search on the "
                              "first start URL's site, as the corpus server serves it); none: crawl from the "
                              "start URLs")
    crawler.add_argument("--seeds", type=int, default=env("seeds", CRAWLER_SEEDS),
                         help="search hits a crawl starts from")
    crawler.add_argument("--min-relevance", type=float, default=env("min_relevance", CRAWLER_MIN_RELEVANCE),
                         help="pages less relevant to the query than this (0..1) are dropped")
    crawler.add_argument("--max-pages", type=int, default=env("max_pages", CRAWLER_MAX_PAGES))
    crawler.add_argument("--max-depth", type=int, default=env("max_depth", CRAWLER_MAX_DEPTH),
                         help="link levels below the seeds")
    replay = parser.add_argument_group("replay")
    replay.add_argument("--trace", type=Path, default=env("trace", None), help="trace file (JSON lines)")
    replay.add_argument("--time-scale", type=float, default=env("time_scale", 1.0),
                        help="multiply the trace's gaps by this")
    parser.add_argument("--log-level", default=env("log_level", "INFO"))
    add_api_key_args(parser, "retriever")
    add_tls_args(parser, "retriever")


def default_port(kind: str) -> int:
    return {"anns": DEFAULT_PORTS["anns"], "crawler": DEFAULT_PORTS["crawler"], "replay": 50063}[kind]
