"""Generates the Python stubs in protos/ from the .proto files beside them.

    python -m protos.generate          # rewrite protos/*_pb2.py, *_pb2.pyi, *_pb2_grpc.py
    python -m protos.generate --check  # exit 1 if the committed stubs differ

The generated files are committed. Generation is a plain grpc_tools.protoc run
with the repository root as include path, so generated imports read
`from protos import common_pb2`; its output is byte-identical on every run with
the same grpcio-tools version.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import importlib.resources
import sys
import tempfile
from pathlib import Path

PROTOS_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTOS_DIR.parent
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    """The .proto files in protos/, sorted."""
    return sorted(PROTOS_DIR.glob("*.proto"))


def committed_stubs() -> dict[str, bytes]:
    """The generated files now in protos/, by file name."""
    return {
        path.name: path.read_bytes() for path in sorted(PROTOS_DIR.iterdir()) if path.name.endswith(GENERATED_SUFFIXES)
    }


def run_protoc(*outputs: str) -> None:
    """Runs grpc_tools.protoc on every .proto file with the given output flags."""
    from grpc_tools import protoc

    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={REPO_ROOT}",
        f"--proto_path={well_known}",
        *outputs,
        *(str(path) for path in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))


def generate_stubs() -> dict[str, bytes]:
    """Runs protoc in a temporary directory and returns its output by file name."""
    with tempfile.TemporaryDirectory() as tmp:
        run_protoc(f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}")
        out_dir = Path(tmp) / PROTOS_DIR.name
        return {path.name: path.read_bytes() for path in sorted(out_dir.iterdir())}


def descriptor_set_with_comments() -> bytes:
    """A serialized FileDescriptorSet of the .proto files, with their comments."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "descriptors.binpb"
        run_protoc(f"--descriptor_set_out={out}", "--include_source_info")
        return out.read_bytes()


def drift(expected: dict[str, bytes], actual: dict[str, bytes]) -> list[str]:
    """Describes how the committed stubs (actual) differ from fresh ones (expected)."""
    problems = []
    for name in sorted(expected.keys() | actual.keys()):
        if name not in actual:
            problems.append(f"missing: protos/{name}")
        elif name not in expected:
            problems.append(f"stale (no .proto generates it): protos/{name}")
        elif expected[name] != actual[name]:
            diff = difflib.unified_diff(
                actual[name].decode(errors="replace").splitlines(),
                expected[name].decode(errors="replace").splitlines(),
                f"protos/{name} (committed)",
                f"protos/{name} (regenerated)",
                lineterm="",
                n=1,
            )
            problems.append("\n".join(list(diff)[:40]))
    return problems


def write_stubs(stubs: dict[str, bytes]) -> None:
    """Replaces the generated files in protos/ with `stubs`."""
    for name in committed_stubs().keys() - stubs.keys():
        (PROTOS_DIR / name).unlink()
    for name, content in stubs.items():
        path = PROTOS_DIR / name
        if not path.exists() or path.read_bytes() != content:
            path.write_bytes(content)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--check", action="store_true", help="report drift instead of writing; exit 1 on drift")
    args = parser.parse_args(argv)
    stubs = generate_stubs()
    if not args.check:
        write_stubs(stubs)
        print(f"wrote {len(stubs)} files to {PROTOS_DIR}")
        return 0
    problems = drift(stubs, committed_stubs())
    if problems:
        version = importlib.metadata.version("grpcio-tools")
        print("\n".join(problems), file=sys.stderr)
        print(
            f"generated stubs are out of date (grpcio-tools {version}); run: python -m protos.generate",
            file=sys.stderr,
        )
        return 1
    print(f"{len(stubs)} generated files are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
