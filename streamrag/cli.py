"""The `streamrag` command line.

Each sub-command imports what it needs only when it runs, so `streamrag --help` is instant
and a command never pays for another's dependencies (torch, transformers, grpc).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from inference_svc.engine.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DTYPE_CHOICES

Handler = Callable[[argparse.Namespace], int]


def lazy(target: str) -> Handler:
    """A handler that imports `module:function` only when its command runs."""
    module, _, name = target.partition(":")

    def handler(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), name)(args)

    return handler


def _cmd_model_prepare(args: argparse.Namespace) -> int:
    from inference_svc.embedded_model import prepare_embedded_model

    directory = prepare_embedded_model(args.cache_dir, force=args.force, progress=not args.quiet)
    print(directory)
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from inference_svc.embedded_model import prepare_embedded_model
    from inference_svc.engine.cost_model import profile_path
    from inference_svc.engine.factory import DTYPES, device_kind
    from inference_svc.engine.profiler import measure_profile, write_profile
    from servicekit.config import default_cache_dir
    from servicekit.hardware import resolve_dtype

    model_dir = args.model or prepare_embedded_model(progress=False)
    dtype = resolve_dtype(args.dtype, args.device)
    tokens = [int(t) for t in args.tokens.split(",")]
    profile = measure_profile(model_dir, device=args.device, dtype=DTYPES[dtype], token_counts=tokens,
                              repeats=args.repeats, say=lambda m: print(m, file=sys.stderr, flush=True))
    out = args.out or profile_path(default_cache_dir(), device_kind(args.device), Path(model_dir).name, dtype)
    print(write_profile(profile, Path(out)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrag",
        description="Serve retrieval-augmented LLM queries whose context arrives as a stream.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    model = commands.add_parser("model", help="prepare and inspect the embedded default model")
    model_cmds = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    prepare = model_cmds.add_parser(
        "prepare", help="convert the bundled SmolLM2-135M-Instruct GGUF into a Hugging Face directory")
    prepare.add_argument("--cache-dir", type=Path, default=None,
                         help="cache root (default: $STREAMRAG_CACHE_DIR or ~/.cache/streamrag)")
    prepare.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    prepare.add_argument("--quiet", action="store_true", help="no progress display")
    prepare.set_defaults(handler=_cmd_model_prepare)

    from streamrag.ask import add_ask_args, add_requests_args

    ask = commands.add_parser("ask", help="ask a question; the answer streams as retrieval goes on")
    add_ask_args(ask)
    ask.set_defaults(handler=lazy("streamrag.ask:run_ask"))
    from streamrag.session import add_session_args

    session = commands.add_parser("session", help="stateful sessions: ingest data continuously, ask many questions, "
                                                  "Flash Queries answered ahead of time")
    add_session_args(session)
    session.set_defaults(handler=lazy("streamrag.session:run_session"))
    requests = commands.add_parser("requests", help="recent requests, or one request's lifecycle from Redis")
    add_requests_args(requests)
    requests.set_defaults(handler=lazy("streamrag.ask:run_requests"))

    serve = commands.add_parser("serve", help="run one service in the foreground")
    serve_cmds = serve.add_subparsers(dest="serve_command", metavar="SERVICE", required=True)
    inference = serve_cmds.add_parser("inference", help="the Inference gRPC service (native engine)")
    from inference_svc.server_args import add_inference_args

    add_inference_args(inference)
    inference.set_defaults(handler=lazy("inference_svc.server:main"))
    orchestrator = serve_cmds.add_parser("orchestrator", help="the Orchestrator gRPC service (Ask, GetRequest)")
    from orchestrator.server_args import add_orchestrator_args

    add_orchestrator_args(orchestrator)
    orchestrator.set_defaults(handler=lazy("orchestrator.server:main"))
    corpus = serve_cmds.add_parser("corpus", help="serve the HTML corpus on loopback for the crawler")
    from retriever_svc.corpus_server import add_serve_corpus_args

    add_serve_corpus_args(corpus)
    corpus.set_defaults(handler=lazy("retriever_svc.corpus_server:run_serve_corpus"))
    retriever = serve_cmds.add_parser("retriever", help="a Retriever gRPC service (anns, crawler or replay)")
    from retriever_svc.server_args import add_retriever_args

    add_retriever_args(retriever)
    retriever.set_defaults(handler=lazy("retriever_svc.server:main"))

    index = commands.add_parser("index", help="build the bundled index; add and remove your own documents")
    index_cmds = index.add_subparsers(dest="index_command", metavar="ACTION", required=True)
    build = index_cmds.add_parser("build", help="extract, split, embed and index an HTML tree (default: Python docs)")
    from retriever_svc.corpus.index import add_index_build_args

    add_index_build_args(build)
    build.set_defaults(handler=lazy("retriever_svc.corpus.index:run_index_build"))
    from streamrag.documents import add_collection_args, add_index_add_args, add_index_remove_args

    index_add = index_cmds.add_parser("add", help="add (or update) your files and folders in a collection, live")
    add_index_add_args(index_add)
    index_add.set_defaults(handler=lazy("streamrag.documents:run_index_add"))
    index_remove = index_cmds.add_parser("remove", help="remove files or folders from a collection")
    add_index_remove_args(index_remove)
    index_remove.set_defaults(handler=lazy("streamrag.documents:run_index_remove"))
    collection = commands.add_parser("collection", help="list, create, drop or merge collections of your documents")
    add_collection_args(collection)
    collection.set_defaults(handler=lazy("streamrag.documents:run_collection"))

    trace = commands.add_parser("trace", help="record, synthesize or summarize retrieval traces")
    trace_cmds = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    record = trace_cmds.add_parser("record", help="record a running Retriever's streams into a trace file")
    from retriever_svc.trace_record import add_trace_record_args

    add_trace_record_args(record)
    record.set_defaults(handler=lazy("retriever_svc.trace_record:run_trace_record"))
    synth = trace_cmds.add_parser("synth", help="synthesize a trace calibrated to the Stream2LLM workloads")
    from load_tests.trace_synth import add_trace_synth_args

    add_trace_synth_args(synth)
    synth.set_defaults(handler=lazy("load_tests.trace_synth:run_trace_synth"))
    trace_stats = trace_cmds.add_parser("stats", help="a trace's statistics beside the Stream2LLM figures")
    from load_tests.trace_synth import add_trace_stats_args

    add_trace_stats_args(trace_stats)
    trace_stats.set_defaults(handler=lazy("load_tests.trace_synth:run_trace_stats"))

    profile = commands.add_parser("profile", help="measure recompute and swap latency for the cost model")
    profile.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    profile.add_argument("--device", default=DEFAULT_DEVICE, help="cpu or cuda[:N]")
    profile.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    profile.add_argument("--tokens", default="16,64,256,512,1024,2048,4096", help="prefill sizes to measure")
    profile.add_argument("--repeats", type=int, default=3)
    profile.add_argument("--out", type=Path, default=None, help="profile JSON (default: the cache's profile path)")
    profile.set_defaults(handler=_cmd_profile)

    bench = commands.add_parser("bench", help="benchmarks that print tables and write JSON")
    bench_cmds = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    engine = bench_cmds.add_parser("engine", help="prefill tokens/s vs transformers; scheduler overhead")
    engine.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    engine.add_argument("--device", default=DEFAULT_DEVICE)
    engine.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    engine.add_argument("--prompt-lengths", default="512,2048,4096")
    engine.add_argument("--repeats", type=int, default=3)
    engine.add_argument("--json", type=Path, default=None, help="write the results here")
    engine.set_defaults(handler=lazy("inference_svc.engine.engine_bench:run_engine_bench"))
    decode = bench_cmds.add_parser("decode", help="decode tokens/s with speculative decoding off, fixed depths, auto")
    from load_tests.decode_bench import add_bench_decode_args

    add_bench_decode_args(decode)
    decode.set_defaults(handler=lazy("load_tests.decode_bench:run_bench_decode"))
    concurrent = bench_cmds.add_parser("concurrent", help="prefill tokens/s of N concurrent Generate calls, "
                                                          "native against vLLM")
    from load_tests.concurrent_bench import add_bench_concurrent_args

    add_bench_concurrent_args(concurrent)
    concurrent.set_defaults(handler=lazy("load_tests.concurrent_bench:run_bench_concurrent"))
    retrieval = bench_cmds.add_parser("retrieval", help="ANNS stage latency and recall against exact search")
    from retriever_svc.retrieval_bench import add_bench_retrieval_args

    add_bench_retrieval_args(retrieval)
    retrieval.set_defaults(handler=lazy("retriever_svc.retrieval_bench:run_bench_retrieval"))
    replay = bench_cmds.add_parser("replay", help="replay a trace against Inference: streaming vs non-streaming")
    from load_tests.replay import add_bench_replay_args

    add_bench_replay_args(replay)
    replay.set_defaults(handler=lazy("load_tests.replay:run_bench_replay"))
    quality = bench_cmds.add_parser("quality", help="retrieval quality through the stack: hit@k of the answering "
                                                    "page, time to the first relevant chunk, per retriever")
    from load_tests.quality import add_bench_quality_args

    add_bench_quality_args(quality)
    quality.set_defaults(handler=lazy("load_tests.quality:run_bench_quality"))
    relevance = bench_cmds.add_parser("relevance", help="calibrate the crawler's relevance threshold and "
                                                        "merge margin on a question set")
    from load_tests.relevance_calibration import add_bench_relevance_args

    add_bench_relevance_args(relevance)
    relevance.set_defaults(handler=lazy("load_tests.relevance_calibration:run_bench_relevance"))
    ingest = bench_cmds.add_parser("ingest", help="your own documents, live: embedding speed, insert-to-searchable, "
                                                  "recall after churn, search latency while ingesting")
    from load_tests.ingest_bench import add_bench_ingest_args

    add_bench_ingest_args(ingest)
    ingest.set_defaults(handler=lazy("load_tests.ingest_bench:run_bench_ingest"))
    sessions = bench_cmds.add_parser("sessions", help="session query TTFT as the session grows vs Generate and the "
                                                      "prefix cache; Flash hits; ingestion tokens/s")
    from load_tests.sessions_bench import add_bench_sessions_args

    add_bench_sessions_args(sessions)
    sessions.set_defaults(handler=lazy("load_tests.sessions_bench:run_bench_sessions"))

    from streamrag.stack.commands import add_down_args, add_status_args, add_up_args

    up = commands.add_parser("up", help="start the whole stack on this machine as processes")
    add_up_args(up)
    up.set_defaults(handler=lazy("streamrag.stack.commands:run_up"))
    status = commands.add_parser("status", help="health and key stats of the local stack")
    add_status_args(status)
    status.set_defaults(handler=lazy("streamrag.stack.commands:run_status"))
    down = commands.add_parser("down", help="stop the local stack started by up")
    add_down_args(down)
    down.set_defaults(handler=lazy("streamrag.stack.commands:run_down"))

    demo = commands.add_parser("demo", help="start the local stack and answer one question, streamed and not")
    from streamrag.demo import add_demo_args

    add_demo_args(demo)
    demo.set_defaults(handler=lazy("streamrag.demo:run_demo"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched from a hub
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
