"""The package layering of docs/architecture.md: no package imports one above it.

Every `import` / `from ... import` in each top-level package (module level or inside a
function, which is where the CLI's lazy imports live) is read with `ast`, so a new upward
import fails here before it becomes a cycle. Inside `inference_svc` the same holds room by
room (engine ← rpc ← native, vllm_backend ← server), and no two of its modules import each
other, directly or round a longer loop. `retriever_svc` is rooms too (corpus, crawler, anns,
collections, milvus) under a short top (the server and what several kinds share), with no
import loop between its modules either.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protos", "servicekit", "inference_svc", "retriever_svc", "orchestrator", "gateway", "load_tests",
            "streamrag")
# What each package may import (besides itself): the graph drawn in docs/architecture.md.
ALLOWED = {
    "protos": set(),
    "servicekit": set(),
    "inference_svc": {"protos", "servicekit"},
    "retriever_svc": {"protos", "servicekit"},
    "orchestrator": {"protos", "servicekit"},
    "gateway": {"protos", "servicekit"},
    "load_tests": {"protos", "servicekit", "inference_svc", "retriever_svc", "orchestrator"},
    "streamrag": {"protos", "servicekit", "inference_svc", "retriever_svc", "orchestrator", "load_tests"},
}


# What each room of inference_svc may import of inference_svc (besides itself). The modules at the
# top (server, server_args, launch, options, embedded_model, profiling) start and serve the rooms.
INFERENCE_ROOMS = {
    "engine": set(),
    "rpc": {"engine", "options"},
    "native": {"engine", "rpc", "options"},
    # the one KV hand-off (its state machine, Transfer(), the call) both backends share: neither backend
    "kv_transfer": {"engine", "rpc", "options"},
    "vllm_backend": {"engine", "rpc", "options", "kv_transfer"},
    "disagg": {"engine", "rpc", "native", "options", "kv_transfer"},   # the native hand-off's hooks
}

# What each room of retriever_svc may import of retriever_svc (besides itself and RETRIEVER_SHARED): whole
# rooms, one way. corpus is the floor (documents at rest, embedding, the site, the collection store); the
# ANNS backend serves the collections; Milvus is the other engine of both.
RETRIEVER_ROOMS = {
    "corpus": set(),
    "crawler": {"corpus"},
    "collections": {"corpus"},
    "anns": {"corpus", "collections"},
    "milvus": {"corpus", "anns", "collections"},
    "replay": set(),                            # a trace needs nothing of the other retrievers
}
# The top of retriever_svc: the service that starts and serves the rooms (server, server_args, service) and
# what several kinds share (stages: every index searches stage by stage; stability).
RETRIEVER_SHARED = {"service", "server_args", "stages", "stability"}
RETRIEVER_TOP = {"__init__", "server", "server_args", "service", "stages", "stability"}


def imported_names(path: Path) -> set[str]:
    """Every module name an absolute import in `path` may load: `from a.b import c` gives a.b and a.b.c."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_packages(package: str) -> dict[str, set[str]]:
    """{imported top-level package: {files importing it}} for one package's own files."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imported_names(path):
            top = name.split(".")[0]
            if top in PACKAGES and top != package:
                found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    """{module: {modules of the same package it imports}}, lazy imports included."""
    modules = {module_name(path): path for path in sorted((ROOT / package).rglob("*.py"))}
    return {name: {n for n in imported_names(path) if n in modules and n != name} for name, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while (other := stack.pop()) != module:
                component.append(other)
            if component:
                cycles.append(sorted([module, *component]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_one_above_it(package: str):
    upward = {top: files for top, files in imported_packages(package).items() if top not in ALLOWED[package]}
    assert not upward, f"{package} imports packages above it: {upward}"


def test_no_inference_svc_modules_import_each_other_round_a_loop():
    """Not server <-> launch (a cycle once), nor any longer loop, lazy imports included."""
    graph = import_graph("inference_svc")
    assert "inference_svc.launch" not in graph["inference_svc.server"]
    assert not import_cycles(graph), f"import cycles in inference_svc: {import_cycles(graph)}"


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("room", sorted(INFERENCE_ROOMS))
def test_each_inference_svc_room_imports_only_the_rooms_below_it(room: str):
    """The engine imports no service package; rpc (shared by both backends) neither backend; the
    backends not each other."""
    upward = {}
    for path in sorted((ROOT / "inference_svc" / room).rglob("*.py")):
        for name in imported_names(path):
            parts = name.split(".")
            if parts[0] == "inference_svc" and len(parts) > 1 and parts[1] not in {room, *INFERENCE_ROOMS[room]}:
                upward.setdefault(parts[1], set()).add(str(path.relative_to(ROOT)))
    assert not upward, f"inference_svc/{room} imports rooms above it: {upward}"


@pytest.mark.parametrize("room", sorted(RETRIEVER_ROOMS), ids=lambda room: f"{room}-room")   # not the opt-in markers
def test_each_retriever_svc_room_imports_only_what_its_row_allows(room: str):
    """No room imports the server, replay or a room its row does not name."""
    upward = {}
    for path in sorted((ROOT / "retriever_svc" / room).rglob("*.py")):
        for name in imported_names(path):
            parts = name.split(".")
            if parts[0] != "retriever_svc" or len(parts) < 2 or parts[1] in {room, *RETRIEVER_SHARED}:
                continue
            if parts[1] not in RETRIEVER_ROOMS[room]:
                upward.setdefault(".".join(parts[1:3]), set()).add(str(path.relative_to(ROOT)))
    assert not upward, f"retriever_svc/{room} imports what its row does not allow: {upward}"


def test_the_retriever_svc_rooms_import_one_way():
    """The table itself has no loop: a room that another may import imports nothing of that room."""
    assert not import_cycles({room: set(allowed) for room, allowed in RETRIEVER_ROOMS.items()})


def test_retriever_svc_is_its_rooms_and_a_short_top():
    """Every retriever backend lives in a room; nothing of a room creeps back to the top (ANNS once did)."""
    package = ROOT / "retriever_svc"
    rooms = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert rooms == set(RETRIEVER_ROOMS)
    assert {p.stem for p in package.glob("*.py")} == RETRIEVER_TOP


def test_no_retriever_svc_modules_import_each_other_round_a_loop():
    graph = import_graph("retriever_svc")
    assert not import_cycles(graph), f"import cycles in retriever_svc: {import_cycles(graph)}"


def test_the_cli_lives_in_streamrag_and_the_orchestrator_is_the_service_alone():
    assert (ROOT / "streamrag" / "cli.py").is_file()
    assert not {"cli.py", "stack.py", "demo.py", "ask_cli.py"} & {p.name for p in (ROOT / "orchestrator").iterdir()}


def test_the_cli_opens_no_redis():
    """Lifecycles are read through the orchestrator (GetRequest, ListRequests): no module of `streamrag`
    imports a Redis client or the lifecycle store (the stack only starts and pings a redis-server)."""
    found = {str(path.relative_to(ROOT)): sorted(names) for path in sorted((ROOT / "streamrag").rglob("*.py"))
             if (names := {n for n in imported_names(path)
                           if n.split(".")[0] == "redis" or n.startswith("orchestrator.lifecycle_store")})}
    assert not found, f"the CLI opens Redis: {found}"


def test_the_local_stack_imports_no_command_above_it():
    """`streamrag/stack/` (the processes, the run directory, the addresses the commands dial) is the room
    every command stands on: it imports none of them."""
    above = {str(path.relative_to(ROOT)): sorted(names) for path in sorted((ROOT / "streamrag" / "stack").rglob("*.py"))
             if (names := {n for n in imported_names(path)
                           if n.startswith("streamrag.") and not n.startswith("streamrag.stack")})}
    assert not above, f"streamrag/stack imports commands above it: {above}"


def test_the_architecture_page_draws_the_same_graph():
    page = (ROOT / "docs" / "architecture.md").read_text()
    for package, allowed in ALLOWED.items():
        for dependency in allowed:
            edge = f"{package} --> {dependency}"
            assert edge in page, f"docs/architecture.md lacks the edge {edge}"


def test_building_the_command_line_parser_imports_no_engine():
    """`streamrag --help` stays instant: the parser's argument modules must not pull in torch or
    transformers (a default imported from the engine once made it take 2.4 s)."""
    code = ("import sys, streamrag.cli; streamrag.cli.build_parser(); "
            "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]"
