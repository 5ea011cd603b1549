"""The one continuation rule (servicekit/continuation.py): its edge cases."""

from __future__ import annotations

import pytest

from servicekit.continuation import DEFAULT_MAX_TOKENS, LENGTH, STOP, budget, continue_after


def test_nothing_delivered_is_the_whole_prompt_with_the_whole_budget():
    rest = continue_after([], 8)
    assert not rest.nothing_left and rest.max_tokens == 8 and rest.prompt_ids([1, 2]) == [1, 2]


def test_some_delivered_continue_after_them_with_the_budget_less_them():
    rest = continue_after([7, 8, 9], 8)
    assert rest.ended is None and rest.max_tokens == 5 and rest.prompt_ids([1, 2]) == [1, 2, 7, 8, 9]


def test_all_delivered_leaves_nothing_and_ends_by_length():
    rest = continue_after([7, 8], 2)
    assert rest.nothing_left and rest.ended == LENGTH and rest.max_tokens == 0 and rest.delivered == (7, 8)


def test_a_budget_of_nothing_leaves_nothing():
    assert continue_after([], 0).ended == LENGTH


def test_a_stop_token_delivered_last_ends_by_stop_even_with_budget_left():
    rest = continue_after([7, 2], 8, stop_token_ids={2})
    assert rest.nothing_left and rest.ended == STOP and rest.max_tokens == 0


def test_a_stop_token_before_the_last_is_not_the_end():
    """Only the last token can have been the stop (the answer ended there); 2 earlier is just a token."""
    assert continue_after([2, 7], 8, stop_token_ids={2}).max_tokens == 6


def test_a_stop_token_as_the_last_of_the_budget_is_a_stop():
    assert continue_after([7, 2], 2, stop_token_ids={2}).ended == STOP


def test_more_delivered_than_allowed_or_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="more than max_tokens 1"):
        continue_after([7, 8], 1)
    with pytest.raises(ValueError, match=">= 0"):
        continue_after([], -1)


def test_a_proto_zero_budget_is_the_servers_default():
    assert budget(0) == DEFAULT_MAX_TOKENS and budget(5) == 5
