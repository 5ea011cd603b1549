"""The one stability rule of update-mode refinements."""

from __future__ import annotations

from retriever_svc.stability import TAIL, TOP, stability_hints


def test_the_top_half_is_stable_the_tail_less_so_and_the_final_stage_has_no_hints():
    assert stability_hints(None, ["a", "b", "c"], final=False) == [TOP, TOP, TAIL]
    assert stability_hints(["a", "b"], ["b", "c", "d", "e"], final=False) == [TOP, TOP, TAIL, TAIL]
    assert stability_hints(["a"], ["a", "c"], final=True) == [None, None]
    assert TOP >= TAIL >= 0.5        # measured survival on the ANNS trace: nothing is deferred there
