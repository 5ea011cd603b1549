"""The `streamrag` command line: one table of commands, walked by one loop.

Each row names a command (its words: `serve inference` is `inference` under `serve`), its help,
the function that adds its flags and the function that runs it, both as `module:function`. The
flag functions are imported when the parser is built, so their modules stay light (no torch,
transformers or vllm at import: tests/test_layering.py checks); the handler's module is imported
only when its command runs, so `streamrag --help` is instant and a command never pays for
another's dependencies.

Every `bench` command but `bench report` runs holding the CPU lock (`load_tests.runner.cpu_lock`),
so a figure is reproduced by its command alone and two benchmarks never share the cores.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

Handler = Callable[[argparse.Namespace], int]


class Command(NamedTuple):
    path: str          # the command's words
    help: str
    args: str          # "module:function" adding its flags to its parser
    run: str           # "module:function" running it


# Commands that only group others: their help, and what their sub-commands are called in usage.
GROUPS = {
    "model": ("prepare and inspect the embedded default model", "ACTION"),
    "serve": ("run one service in the foreground", "SERVICE"),
    "index": ("build the bundled index; add and remove your own documents", "ACTION"),
    "trace": ("record, synthesize or summarize retrieval traces", "ACTION"),
    "bench": ("benchmarks that print tables and write JSON; each holds the CPU lock", "BENCH"),
}
# The bench commands that measure nothing (they read what a bench wrote), so take no CPU lock;
# `bench cpu record` runs beside a bench.
CPU_FREE = {"bench report", "bench who", "bench steplog", "bench per-request", "bench ttft-floor", "bench cpu"}

COMMANDS = (
    Command("model prepare", "convert the bundled SmolLM2-135M-Instruct GGUF into a Hugging Face directory",
            "inference_svc.embedded_model:add_model_prepare_args", "inference_svc.embedded_model:run_model_prepare"),
    Command("ask", "ask a question; the answer streams as retrieval goes on",
            "streamrag.ask:add_ask_args", "streamrag.ask:run_ask"),
    Command("session", "stateful sessions: ingest data continuously, ask many questions, Flash Queries answered "
                       "ahead of time",
            "streamrag.session:add_session_args", "streamrag.session:run_session"),
    Command("requests", "recent requests, or one request's lifecycle, as the orchestrator recorded them",
            "streamrag.lifecycles:add_requests_args", "streamrag.lifecycles:run_requests"),
    Command("serve inference", "the Inference gRPC service (native engine)",
            "inference_svc.server_args:add_inference_args", "inference_svc.server:main"),
    Command("serve orchestrator", "the Orchestrator gRPC service (Ask, GetRequest, ListRequests) and Sessions",
            "orchestrator.server_args:add_orchestrator_args", "orchestrator.server:main"),
    Command("serve corpus", "serve the HTML corpus on loopback for the crawler",
            "retriever_svc.corpus.web_server:add_serve_corpus_args",
            "retriever_svc.corpus.web_server:run_serve_corpus"),
    Command("serve retriever", "a Retriever gRPC service (anns, crawler or replay)",
            "retriever_svc.server_args:add_retriever_args", "retriever_svc.server:main"),
    Command("serve gateway", "the OpenAI-compatible HTTP gateway (chat and completions, retrieval, streaming input)",
            "gateway.server_args:add_gateway_args", "gateway.server:main"),
    Command("index build", "extract, split, embed and index an HTML tree (default: Python docs)",
            "retriever_svc.corpus.index:add_index_build_args", "retriever_svc.corpus.index:run_index_build"),
    Command("index add", "add (or update) your files and folders in a collection, live",
            "streamrag.documents:add_index_add_args", "streamrag.documents:run_index_add"),
    Command("index remove", "remove files or folders from a collection",
            "streamrag.documents:add_index_remove_args", "streamrag.documents:run_index_remove"),
    Command("collection", "list, create, drop or merge collections of your documents",
            "streamrag.documents:add_collection_args", "streamrag.documents:run_collection"),
    Command("trace record", "record a running Retriever's streams into a trace file",
            "retriever_svc.replay.record:add_trace_record_args", "retriever_svc.replay.record:run_trace_record"),
    Command("trace synth", "synthesize a trace calibrated to the Stream2LLM workloads",
            "load_tests.trace_synth:add_trace_synth_args", "load_tests.trace_synth:run_trace_synth"),
    Command("trace stats", "a trace's statistics beside the Stream2LLM figures",
            "load_tests.trace_synth:add_trace_stats_args", "load_tests.trace_synth:run_trace_stats"),
    Command("profile", "measure recompute and swap latency for the cost model",
            "inference_svc.profiling:add_profile_args", "inference_svc.profiling:run_profile"),
    Command("bench gpu", "the engine on one GPU: paged-attention kernels, CUDA graphs, decode against the memory "
            "roofline, prefill MFU, streaming TTFT, launches and syncs per step (--device cpu --small: dry run)",
            "load_tests.gpu_bench:add_bench_gpu_args", "load_tests.gpu_bench:run_bench_gpu"),
    Command("bench gpu-replay", "the Stream2LLM replay at the paper's scale on one GPU: crawler at 4 QPS and ANNS "
            "at 1 QPS, streaming against not, TTFT p50/p95 (--device cpu --small: dry run)",
            "load_tests.gpu_replay:add_bench_gpu_replay_args", "load_tests.gpu_replay:run_bench_gpu_replay"),
    Command("bench engine", "prefill tokens/s vs transformers; scheduler overhead",
            "load_tests.engine_bench:add_bench_engine_args", "load_tests.engine_bench:run_engine_bench"),
    Command("bench decode", "decode tokens/s with speculative decoding off, fixed depths, auto",
            "load_tests.decode_bench:add_bench_decode_args", "load_tests.decode_bench:run_bench_decode"),
    Command("bench disagg", "disaggregated prefill/decode (KV shipped per chunk) against one colocated replica on "
            "the same cores: ITL, TTFT, hand-off, goodput",
            "load_tests.disagg_bench:add_bench_disagg_args", "load_tests.disagg_bench:run_bench_disagg"),
    Command("bench steps", "step times, cancel latency and a new request's TTFT behind a long prefill: fixed "
                           "token budget against steps bounded in time",
            "load_tests.step_budget_bench:add_bench_steps_args", "load_tests.step_budget_bench:run_bench_steps"),
    Command("bench concurrent", "prefill tokens/s of N concurrent Generate calls, native against vLLM",
            "load_tests.concurrent_bench:add_bench_concurrent_args",
            "load_tests.concurrent_bench:run_bench_concurrent"),
    Command("bench retrieval", "ANNS stage latency and recall against exact search; --backend diskannpy,milvus "
            "compares the backends", "load_tests.retrieval_bench:add_args", "load_tests.retrieval_bench:run"),
    Command("bench blend", "KV reuse of retrieved passages (blend) against exact: ANNS replay p95, TTFT across "
                           "requests, answer agreement, the --blend-recompute sweep",
            "load_tests.blend_bench:add_args", "load_tests.blend_bench:run"),
    Command("bench replay", "replay a trace against Inference: streaming vs non-streaming",
            "load_tests.replay:add_bench_replay_args", "load_tests.replay:run_bench_replay"),
    Command("bench paper", "the Stream2LLM evaluation on this machine: load sweeps, memory pressure and ours against "
            "vLLM, each step a bench replay over every seed",
            "load_tests.paper:add_bench_paper_args", "load_tests.paper:run_bench_paper"),
    Command("bench quality", "retrieval quality through the stack: hit@k of the answering page, time to the first "
                             "relevant chunk, per retriever",
            "load_tests.quality:add_bench_quality_args", "load_tests.quality:run_bench_quality"),
    Command("bench relevance", "calibrate the crawler's relevance threshold and merge margin on a question set",
            "load_tests.relevance_calibration:add_bench_relevance_args",
            "load_tests.relevance_calibration:run_bench_relevance"),
    Command("bench ingest", "your own documents, live: embedding speed, insert-to-searchable, recall after churn, "
                            "search latency while ingesting",
            "load_tests.ingest_bench:add_bench_ingest_args", "load_tests.ingest_bench:run_bench_ingest"),
    Command("bench sessions", "session query TTFT as the session grows vs Generate and the prefix cache; Flash hits; "
                              "ingestion tokens/s",
            "load_tests.sessions_bench:add_bench_sessions_args", "load_tests.sessions_bench:run_bench_sessions"),
    Command("bench fairness", "two tenants on one replica: a light user beside a flood with fair share off and on, "
            "and two floods' shares by weight", "load_tests.fairness_bench:add_bench_fairness_args",
            "load_tests.fairness_bench:run_bench_fairness"),
    Command("bench report", "regenerate the results page (docs/results.md) and its plots from the result summaries",
            "load_tests.results_page:add_bench_report_args", "load_tests.results_page:run_bench_report"),
    Command("bench embed", "embedding backends side by side: passages/s and agreement with the reference",
            "load_tests.embed_options:add_bench_embed_args", "load_tests.embed_options:run_bench_embed"),
    Command("bench ttft-floor", "a replay run's zero-load TTFT bound per request: the whole prefill against the last "
            "chunk's", "load_tests.ttft_floor:add_bench_ttft_floor_args", "load_tests.ttft_floor:run_bench_ttft_floor"),
    Command("bench per-request", "which requests of replay runs streaming made slower, and by how much",
            "load_tests.per_request:add_bench_per_request_args", "load_tests.per_request:run_bench_per_request"),
    Command("bench who", "the engine steps between a request's last chunk and its first token (a step log)",
            "load_tests.who:add_bench_who_args", "load_tests.who:run_bench_who"),
    Command("bench steplog", "summarize our class's step logs inside vLLM (STREAMRAG_VLLM_STEP_LOG)",
            "load_tests.vllm_steps:add_bench_steplog_args", "load_tests.vllm_steps:run_bench_steplog"),
    Command("bench cpu", "record every process's CPU time; report it for each slow step of a step log",
            "load_tests.cpu_sampler:add_bench_cpu_args", "load_tests.cpu_sampler:run_bench_cpu"),
    Command("bench gateway", "time to first token and per-token overhead the HTTP gateway adds to an Ask",
            "load_tests.gateway_bench:add_bench_gateway_args", "load_tests.gateway_bench:run_bench_gateway"),
    Command("bench chaos", "a soak of asks while services are killed and frozen: failures per fault, recovery, "
                           "lost lifecycle events, leaked blocks, answers against a fault-free pass",
            "load_tests.chaos.run:add_bench_chaos_args", "load_tests.chaos.run:run_bench_chaos"),
    Command("certs", "a local CA and a certificate per service (compose, local and Kubernetes DNS names); "
                     "optionally as Kubernetes Secrets",
            "streamrag.stack.certs:add_certs_args", "streamrag.stack.certs:run_certs"),
    Command("up", "start the whole stack on this machine as processes",
            "streamrag.stack.commands:add_up_args", "streamrag.stack.commands:run_up"),
    Command("status", "health and key stats of the local stack",
            "streamrag.stack.commands:add_status_args", "streamrag.stack.commands:run_status"),
    Command("down", "stop the local stack started by up",
            "streamrag.stack.commands:add_down_args", "streamrag.stack.commands:run_down"),
    Command("demo", "start the local stack and answer one question, streamed and not",
            "streamrag.demo:add_demo_args", "streamrag.demo:run_demo"),
)


def resolve(target: str) -> Callable:
    """The function a `module:function` names (imports its module)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def lazy(target: str) -> Handler:
    """A handler that imports `module:function` only when its command runs."""
    return lambda args: resolve(target)(args)


def holding_cpu_lock(handler: Handler) -> Handler:
    """`handler` run under the CPU lock (/tmp/streamrag-cpu.lock), waiting while another bench holds it."""
    def run(args: argparse.Namespace) -> int:
        from load_tests.runner import cpu_lock

        with cpu_lock():
            return handler(args)
    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrag", allow_abbrev=False,
        description="Serve retrieval-augmented LLM queries whose context arrives as a stream.",
    )
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for command in COMMANDS:
        *group, name = command.path.split()
        commands = top
        if group:
            (word,) = group
            if word not in groups:
                help_text, metavar = GROUPS[word]
                groups[word] = top.add_parser(word, help=help_text, allow_abbrev=False).add_subparsers(
                    dest=f"{word}_command", metavar=metavar, required=True)
            commands = groups[word]
        sub = commands.add_parser(name, help=command.help, allow_abbrev=False)
        resolve(command.args)(sub)
        handler = lazy(command.run)
        if group == ["bench"] and command.path not in CPU_FREE:
            handler = holding_cpu_lock(handler)
        sub.set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched from a hub
    args = build_parser().parse_args(argv)
    from streamrag.stack.state import use_stack_key

    use_stack_key(getattr(args, "run_dir", None))
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
