"""The retriever names users type map to `RetrieverChoice` in one place (protos/retrievers.py)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from gateway.protocol import RetrievalOptions
from protos import orchestrator_pb2
from protos.retrievers import LIVE_RETRIEVERS, RETRIEVER_CHOICES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protos", "servicekit", "inference_svc", "retriever_svc", "orchestrator", "gateway", "load_tests",
            "streamrag")


def name_maps(path: Path) -> list[int]:
    """Lines of dict literals in `path` that map a string to a `RETRIEVER_CHOICE_*` value."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
            if isinstance(node, ast.Dict) and any(
                isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Attribute)
                and value.attr.startswith("RETRIEVER_CHOICE_")
                for key, value in zip(node.keys, node.values, strict=True))]


def test_the_name_map_is_written_once():
    found = {str(path.relative_to(ROOT)): lines for package in PACKAGES
             for path in sorted((ROOT / package).rglob("*.py")) if (lines := name_maps(path))}
    assert list(found) == ["protos/retrievers.py"], found


def test_every_choice_but_unspecified_has_a_name_and_the_gateway_takes_the_live_ones():
    named = set(RETRIEVER_CHOICES.values())
    assert named == set(orchestrator_pb2.RetrieverChoice.values()) - {orchestrator_pb2.RETRIEVER_CHOICE_UNSPECIFIED}
    assert set(LIVE_RETRIEVERS) <= set(RETRIEVER_CHOICES)
    assert typing.get_args(RetrievalOptions.model_fields["retriever"].annotation) == LIVE_RETRIEVERS
