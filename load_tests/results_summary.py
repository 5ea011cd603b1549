"""Reading the results page's summaries and formatting their numbers: `Node` (a value with where it came
from), references into a summary (`pick`), tables, the command block, and targets decided from the
measured values. `results_page` renders the sections with these."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

SPREAD = ("median", "min", "max")


class SummaryError(Exception):
    """A summary file is missing, unreadable, or lacks a value the page needs."""


class Node:
    """A value read from a summary, with where it came from (for errors) and the page's number format."""

    __slots__ = ("value", "where")

    def __init__(self, value: Any, where: str) -> None:
        self.value = value
        self.where = where

    def __getitem__(self, key: str | int) -> Node:
        value = self.value
        if isinstance(value, dict) and key in value:
            return Node(value[key], f"{self.where}/{key}")
        if isinstance(value, list):
            if isinstance(key, str) and key.isdigit():
                key = int(key)
            if isinstance(key, int) and -len(value) <= key < len(value):
                return Node(value[key], f"{self.where}/{key}")
            for item in value:
                if isinstance(item, dict) and item.get("id") == key:
                    return Node(item, f"{self.where}/{key}")
        if isinstance(key, str) and key in SPREAD and isinstance(value, int | float):
            return self                                  # a single run: its median, min and max are the value
        file, _, path = self.where.partition(":")
        raise SummaryError(f"{file}: missing key '{f'{path}/{key}'.lstrip('/')}'")

    def __iter__(self) -> Iterator[Node]:
        if not isinstance(self.value, list):
            raise SummaryError(f"{self.where}: expected a list")
        return (Node(item, f"{self.where}/{i}") for i, item in enumerate(self.value))

    def get_id(self, key: str) -> Node | None:
        """The item of a list whose `id` is `key`, or None."""
        found = [i for i, item in enumerate(self.value) if isinstance(item, dict) and item.get("id") == key]
        return self[found[0]] if found else None

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if isinstance(self.value, dict) and key in self.value else default

    def number(self) -> float:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float):
            raise SummaryError(f"{self.where}: expected a number, found {self.value!r}")
        return self.value

    def __format__(self, spec: str) -> str:
        value = self.value
        if isinstance(value, str):
            return value
        if isinstance(value, dict):
            if not all(k in value for k in SPREAD):
                raise SummaryError(f"{self.where}: expected a number or median/min/max, found keys {sorted(value)}")
            median, low, high = (self[k].number() for k in SPREAD)
            bound = (spec[:-1] or ratio_spec(median)) if spec.endswith("x") else spec
            return f"{number(median, spec)} ({number(low, bound)}-{number(high, bound)})"
        return number(self.number(), spec)

    def __str__(self) -> str:
        return format(self, "")


def ratio_spec(value: float) -> str:
    return ".0f" if abs(value) >= 100 else ".2f"


def number(value: float, spec: str = "") -> str:
    """`x`: a ratio with two decimals (none from 100 on) and its unit (1.31x, 145x); '': as
    stored, with thousands separators (1,356; 0.58); anything else: Python's format spec."""
    if spec.endswith("x"):
        return f"{value:{spec[:-1] or ratio_spec(value)}}x"
    if spec:
        return format(value, spec)
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
        value = int(value)
    return f"{value:,}"


def resolve(summary: Node, ref: Node) -> list[Node]:
    """A target's value: itself, or the value(s) an `@path` reference names (`*` = every item)."""
    if not (isinstance(ref.value, str) and ref.value.startswith("@")):
        return [ref]
    text = ref.value[1:]
    if text.startswith(("min ", "max ")):
        text = text[4:]
    found = []
    for path in text.split(", "):
        nodes = [summary]
        for part in path.split("/"):
            nodes = [child for node in nodes for child in (children(node) if part == "*" else [node[part]])]
        found += nodes
    return found


def children(node: Node) -> list[Node]:
    return [node[key] for key in node.value] if isinstance(node.value, dict) else list(node)


def pick(summary: Node, ref: Node) -> Node:
    nodes = resolve(summary, ref)
    text = ref.value if isinstance(ref.value, str) else ""
    if text.startswith("@max "):
        return max(nodes, key=lambda n: n["median"].number())
    return min(nodes, key=lambda n: n["median"].number())


# ---------------------------------------------------------------------------- page pieces

def table(header: Iterable[str], rows: Iterable[str], right: int = 1) -> list[str]:
    """A markdown table; `right`: columns from this one on are right-aligned (numbers)."""
    header = list(header)
    align = ["---" if i < right else "---:" for i in range(len(header))]
    return [f"| {' | '.join(header)} |", f"|{'|'.join(align)}|", *(f"| {row} |" for row in rows), ""]


def block(run: Node, cells: str = "median (min-max) over seeds") -> list[str]:
    """The command that produced a table, right above it, with the machine and seeds."""
    runs, command = str(run["seeds"]), commands(str(run["command"]))
    where = f"Machine: **{run['machine']}**. {'Seeds' if runs[:1].isdigit() else 'Runs'}: {runs}; cells: {cells}."
    if len(command) <= 3 and not any("`" in line for line in command):   # inline, beside the machine
        lines = ["; ".join(f"`{line}`" for line in command) + f". {where}"]
    else:
        lines = ["```bash", *command, "```", where]
    if run.get("note") is not None:
        lines[-1] += f" {run['note']}"
    return [*lines, ""]


def commands(text: str) -> list[str]:
    """A command block's commands, one a line: a `\\` continuation joined to its command, a line that is
    only a comment appended to the command above it, two spaces before a comment."""
    lines: list[str] = []
    for line in text.splitlines():
        if lines and lines[-1].endswith("\\"):
            lines[-1] = f"{lines[-1][:-1].rstrip()} {line.strip()}"
        elif lines and line.lstrip().startswith("#"):
            lines[-1] = f"{lines[-1]}   {line.strip()}"
        else:
            lines.append(line.rstrip())
    return [re.sub(r"\s+# ", "  # ", line) for line in lines]


def targets(summary: Node) -> list[str]:
    """Each target as met or missed, decided from the measured value: one line per target that is not
    plainly met, with its reason, then the met ones together on one line."""
    lines, met = [], []
    for item in summary["targets"]:
        goal, unit = item["target"], str(item.get("unit", Node("", "")))
        at_most = bool(item.get("at_most", Node(False, "")).value)
        measured = pick(summary, item["measured"])
        worst_ref = item.get("worst")
        worst = pick(summary, worst_ref)["median"] if worst_ref is not None else measured["max" if at_most else "min"]
        shown = with_unit(measured, unit)
        if worst_ref is not None:
            shown += f", lowest seed {with_unit(worst, unit)}"
        goal_text = f"{'≤' if at_most else '≥'} {with_unit(goal, unit)}"
        if not holds(measured["median"].number(), goal.number(), at_most):
            status = "missed"
        elif holds(worst.number(), goal.number(), at_most):
            met.append(f"{item['what']} (target {goal_text}, measured {shown})")
            continue
        else:
            status = "met on the median, not in every seed"
        lines.append(f"- **{status.capitalize()}**: {item['what']}; target {goal_text}, measured {shown}. "
                     f"{item['reason']}")
    if met:
        lines.append(f"- **Met**: {'; '.join(met)}.")
    return [*lines, ""]


def holds(value: float, goal: float, at_most: bool) -> bool:
    return value <= goal if at_most else value >= goal


def with_unit(value: Node, unit: str) -> str:
    return format(value, "x") if unit == "x" else f"{value}{unit}"


def speedups(cells: Node) -> str:
    return " | ".join(format(cells[p], "x") for p in ("p50", "p95", "p99"))


def seconds(cells: Node) -> str:
    return " / ".join(format(cells[p], ".2f") for p in ("p50", "p95", "p99"))


def span(values: Iterable[Node], spec: str = "x") -> str:
    numbers = sorted(v.number() for v in values)
    low, high = number(numbers[0], spec), number(numbers[-1], spec)
    return low if low == high else f"{low.removesuffix('x')}-{high}"


def image(name: str, alt: str) -> list[str]:
    return [f"![{alt}](results/{name}.png)", ""]
