"""The `streamrag` command line.

Each sub-command imports what it needs only when it runs, so `streamrag --help` is instant
and a command never pays for another's dependencies (torch, transformers, grpc).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

Handler = Callable[[argparse.Namespace], int]


def _cmd_model_prepare(args: argparse.Namespace) -> int:
    from inference_svc.embedded_model import prepare_embedded_model

    directory = prepare_embedded_model(args.cache_dir, force=args.force, progress=not args.quiet)
    print(directory)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    print("streamrag demo: the streamed RAG answer needs the inference service, retrievers and "
          "orchestrator, which are not built yet. Set-up is complete: the embedded model is in "
          f"{_embedded_dir_for_message()}.")
    return 0


def _embedded_dir_for_message() -> str:
    from inference_svc.embedded_model import embedded_model_dir

    return str(embedded_model_dir())


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

    demo = commands.add_parser("demo", help="run a streamed RAG answer on the local stack")
    demo.set_defaults(handler=_cmd_demo)
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
