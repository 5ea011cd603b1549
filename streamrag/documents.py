"""`streamrag collection list|create|drop|merge` and `streamrag index add|remove`: your own documents.

They talk to the ANNS retriever's `Collections` service (the local stack's, or --anns). `index
add` reads files and folders here and sends each file's bytes; the retriever loads, splits,
embeds and indexes it, and answers once it is searchable. One line per file that could not
be indexed; the rest go on.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from servicekit.config import DEFAULT_PORTS

MAX_FILE_BYTES = 60 * 2**20          # under the service's 64 MiB message limit
DEFAULT_ANNS = f"127.0.0.1:{DEFAULT_PORTS['anns']}"
COLUMNS = ("name", "state", "files", "passages", "disk_passages", "memory_passages", "deleted_passages")


def add_anns_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--anns", default=None, help=f"the ANNS retriever, host:port (default: the local stack's, "
                                                     f"else {DEFAULT_ANNS})")


def add_collection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list", "create", "drop", "merge"],
                        help="list the collections, create or drop one, or merge its in-memory part now")
    parser.add_argument("name", nargs="?", help="the collection (create, drop, merge)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_anns_arg(parser)


def add_index_add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, help="files and folders (read recursively): md, rst, txt, "
                                                            "html, pdf")
    parser.add_argument("--collection", required=True, help="the collection (made by its first add if missing)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_anns_arg(parser)


def add_index_remove_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, help="files, or folders (every file under them)")
    parser.add_argument("--collection", required=True)
    add_anns_arg(parser)


def _stub(args: argparse.Namespace):
    from protos import retriever_pb2_grpc
    from servicekit.auth import keyed_channel
    from streamrag.stack.addresses import stack_service_target

    address = args.anns or stack_service_target("anns") or DEFAULT_ANNS
    # presents the client's key (STREAMRAG_API_KEY / the stack's key file): a retriever with keys wants one
    channel = keyed_channel(address, options=[("grpc.max_send_message_length", 64 * 2**20)])
    return retriever_pb2_grpc.CollectionsStub(channel)


def _fail(exc) -> int:
    print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
    return 1


def run_collection(args: argparse.Namespace) -> int:
    import json

    import grpc
    from google.protobuf.json_format import MessageToDict

    from protos import retriever_pb2 as pb

    if args.action != "list" and not args.name:
        print(f"error: `collection {args.action}` needs a NAME", file=sys.stderr)
        return 2
    stub = _stub(args)
    try:
        if args.action == "list":
            infos = list(stub.ListCollections(pb.ListCollectionsRequest(), timeout=30).collections)
        elif args.action == "create":
            infos = [stub.CreateCollection(pb.CreateCollectionRequest(name=args.name), timeout=30).collection]
        elif args.action == "drop":
            infos = [stub.DropCollection(pb.DropCollectionRequest(name=args.name), timeout=300).dropped]
        else:
            infos = [stub.MergeCollection(pb.MergeCollectionRequest(name=args.name), timeout=3600).collection]
    except grpc.RpcError as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps([MessageToDict(i, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
                          for i in infos], indent=2))
        return 0
    verb = {"create": "created", "drop": "dropped", "merge": "merged"}.get(args.action)
    if verb:
        print(f"{verb} {args.name}")
    print("  ".join(f"{c:>16}" if c != "name" else f"{c:<20}" for c in COLUMNS))
    for info in infos:
        name = info.name + (" *" if info.is_default else "") + (" (read-only)" if info.read_only else "")
        state = info.state + (f": {info.progress}" if info.progress else "")
        row = [f"{name:<20}", f"{state:>16}"] + [f"{getattr(info, c):>16,}" for c in COLUMNS[2:]]
        print("  ".join(row))
    return 0


def _files(paths: list[Path]) -> Iterator[tuple[Path, str | None]]:
    from retriever_svc.corpus.loaders import iter_files

    yield from iter_files([path.expanduser().resolve() for path in paths])


def run_index_add(args: argparse.Namespace) -> int:
    import grpc
    from tqdm import tqdm

    from protos import retriever_pb2 as pb

    stub = _stub(args)
    files = list(_files(args.paths))
    problems = [(path, error) for path, error in files if error]
    readable = [path for path, error in files if not error]
    for path, error in problems:
        print(f"skipped {path}: {error}", file=sys.stderr)
    try:                                        # a collection is made by its first add
        stub.CreateCollection(pb.CreateCollectionRequest(name=args.collection), timeout=30)
        print(f"created collection {args.collection}", file=sys.stderr)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
            return _fail(exc)

    def requests():
        for path in readable:
            try:
                size = path.stat().st_size
                if size > MAX_FILE_BYTES:
                    raise OSError(f"{size / 2**20:.0f} MiB; the limit is {MAX_FILE_BYTES / 2**20:.0f} MiB")
                content = path.read_bytes()
            except OSError as exc:
                content = None
                problems.append((path, exc.strerror or str(exc)))
                print(f"skipped {path}: {exc.strerror or exc}", file=sys.stderr)
                bar.update(1)
            if content is not None:
                yield pb.AddFilesRequest(collection=args.collection, path=str(path), content=content)

    counts: Counter[str] = Counter()
    passages = 0
    with tqdm(total=len(readable), desc=f"index add {args.collection}", unit="file",
              disable=args.quiet or not readable) as bar:
        try:
            for result in stub.AddFiles(requests()):
                bar.update(1)
                counts[pb.AddFileStatus.Name(result.status).removeprefix("ADD_FILE_STATUS_")] += 1
                passages += result.passages if result.status != pb.ADD_FILE_STATUS_FAILED else 0
                if result.status == pb.ADD_FILE_STATUS_FAILED:
                    bar.write(f"not indexed: {result.path}: {result.message}", file=sys.stderr)
        except grpc.RpcError as exc:
            bar.close()
            return _fail(exc)
    added, replaced, unchanged, failed = (counts[s] for s in ("ADDED", "REPLACED", "UNCHANGED", "FAILED"))
    print(f"{args.collection}: {added} added, {replaced} replaced, {unchanged} unchanged, "
          f"{failed + len(problems)} not indexed; {passages} passages in the files indexed")
    return 0 if added + replaced + unchanged or not (failed or problems) else 1


def run_index_remove(args: argparse.Namespace) -> int:
    import grpc

    from protos import retriever_pb2 as pb

    paths = [str(path.expanduser().absolute()) for path in args.paths]
    paths += [os.path.realpath(path) for path in paths if os.path.realpath(path) != path]
    try:
        response = _stub(args).RemoveFiles(pb.RemoveFilesRequest(collection=args.collection, paths=paths), timeout=300)
    except grpc.RpcError as exc:
        return _fail(exc)
    if not response.removed:
        print(f"{args.collection}: nothing indexed under {', '.join(map(str, args.paths))}", file=sys.stderr)
        return 1
    print(f"{args.collection}: removed {len(response.removed)} files ({response.passages} passages)")
    return 0
