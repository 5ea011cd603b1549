"""The package layering of docs/architecture.md: no package imports one above it.

Every `import` / `from ... import` in each top-level package (module level or inside a
function, which is where the CLI's lazy imports live) is read with `ast`, so a new upward
import fails here before it becomes a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protos", "servicekit", "inference_svc", "retriever_svc", "orchestrator", "load_tests", "streamrag")
# What each package may import (besides itself): the graph drawn in docs/architecture.md.
ALLOWED = {
    "protos": set(),
    "servicekit": set(),
    "inference_svc": {"protos", "servicekit"},
    "retriever_svc": {"protos", "servicekit"},
    "orchestrator": {"protos", "servicekit"},
    "load_tests": {"protos", "servicekit", "inference_svc", "retriever_svc", "orchestrator"},
    "streamrag": {"protos", "servicekit", "inference_svc", "retriever_svc", "orchestrator", "load_tests"},
}


def imported_packages(package: str) -> dict[str, set[str]]:
    """{imported top-level package: {files importing it}} for one package's own files."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in PACKAGES and top != package:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_one_above_it(package: str):
    upward = {top: files for top, files in imported_packages(package).items() if top not in ALLOWED[package]}
    assert not upward, f"{package} imports packages above it: {upward}"


def test_the_cli_lives_in_streamrag_and_the_orchestrator_is_the_service_alone():
    assert (ROOT / "streamrag" / "cli.py").is_file()
    assert not {"cli.py", "stack.py", "demo.py", "ask_cli.py"} & {p.name for p in (ROOT / "orchestrator").iterdir()}


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
