"""Every write to the lifecycle store goes through orchestrator/recording.py, and no orchestrator
module grows past 350 lines: read from the source with `ast`, so a direct write or an overgrown
module fails here before it lands."""

from __future__ import annotations

import ast
from pathlib import Path

ORCHESTRATOR = Path(__file__).resolve().parents[2] / "orchestrator"
WRITES = {"create", "event", "update"}
WRITERS = {"recording.py", "lifecycle_store.py", "lifecycle_records.py"}   # the rules, and the store itself
MAX_LINES = 350


def direct_writes(source: str) -> list[str]:
    """`<something>store.create/event/update(...)` calls: `self.store.event(...)`, `store.update(...)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
            if name.endswith("store"):
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
    return found


def test_the_finder_finds_a_direct_write():
    assert direct_writes("async def f(self):\n    await self.store.event('r', 'X')\n") == [
        "line 2: self.store.event"]
    assert direct_writes("await record_error(store, 'r', 'x')\nstore_keys.update({})\n") == []


def test_no_orchestrator_module_writes_the_store_but_recording():
    found = {path.name: writes for path in sorted(ORCHESTRATOR.glob("*.py"))
             if path.name not in WRITERS and (writes := direct_writes(path.read_text()))}
    assert not found, f"direct lifecycle-store writes outside recording.py: {found}"


def test_no_orchestrator_module_is_over_350_lines():
    sizes = {path.name: n for path in sorted(ORCHESTRATOR.glob("*.py"))
             if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not sizes, f"orchestrator modules over {MAX_LINES} lines: {sizes}"
