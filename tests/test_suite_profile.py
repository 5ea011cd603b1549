"""The default suite is deterministic: property tests draw the same examples on every run (tests/conftest.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

DRAWN: list[list[list[int]]] = []


def test_hypothesis_runs_derandomized_without_a_deadline():
    active = settings()
    assert active.derandomize and active.deadline is None and active.print_blob


@given(st.lists(st.integers(), max_size=5))
def _draws(values: list[int]) -> None:
    DRAWN[-1].append(values)


def test_two_runs_of_a_property_draw_the_same_examples():
    for _ in range(2):
        DRAWN.append([])
        _draws()
    assert DRAWN[0] == DRAWN[1] and len(DRAWN[0]) > 1
