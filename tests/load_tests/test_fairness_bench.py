"""`streamrag bench fairness`'s arithmetic (no stack): share error, hung asks, the per-run summary, and
its flags."""

from __future__ import annotations

import argparse
import math

import pytest

from load_tests.fairness_bench import (
    ENGINE_COUNTERS,
    Ask,
    Round,
    add_bench_fairness_args,
    hung_ask,
    share_error,
    summarize,
)


def test_share_error_is_the_largest_relative_gap_to_the_weights_share():
    assert share_error({"a": 300, "b": 100}, (("a", 3.0), ("b", 1.0))) == 0.0
    assert share_error({"a": 500, "b": 500}, (("a", 1.0), ("b", 1.0))) == 0.0
    # 60/40 against 50/50: each is 10 points off its 50: 20%
    assert share_error({"a": 600, "b": 400}, (("a", 1.0), ("b", 1.0))) == 0.2
    assert math.isnan(share_error({}, (("a", 1.0), ("b", 1.0))))


def test_an_ask_is_hung_without_a_first_token_or_an_error_within_max_queue_s_and_the_grace():
    assert not hung_ask(Ask("t", sent=0.0, first_token=3.0, ended=9.0, status="ok"), 10)
    assert not hung_ask(Ask("t", sent=0.0, ended=10.2, status="UNAVAILABLE"), 10)     # refused in time
    assert hung_ask(Ask("t", sent=0.0, ended=40.0, status="UNAVAILABLE"), 10)          # refused too late
    assert hung_ask(Ask("t", sent=0.0, first_token=16.0, ended=17.0, status="ok"), 10)
    assert hung_ask(Ask("t", sent=0.0, ended=200.0, status=""), 10)                    # never answered


def test_a_runs_summary_counts_the_light_tenants_ttft_tokens_in_the_window_and_rejections():
    asks = [Ask("light", 0.0, 1.0, 2.0, "ok", 10), Ask("light", 5.0, 8.0, 9.0, "ok", 10),
            Ask("flood", 0.0, 4.0, 6.0, "ok", 30), Ask("flood", 1.0, 12.0, 13.0, "ok", 30),
            Ask("flood", 2.0, None, 12.5, "UNAVAILABLE")]
    counts = dict.fromkeys(ENGINE_COUNTERS, 0) | {"steps": 40, "prompt_tokens_computed": 60, "generated_tokens": 20}
    out = summarize([Round(asks, started=0.0, until=10.0, engine=counts)], max_queue_s=10)
    assert out["light_asks"] == 2 and out["light_ttft_p50_s"] == 2.0
    assert out["tokens_by_tenant"] == {"light": 20, "flood": 30}      # the one ending at 13 s is past the window
    assert out["tokens_per_s"] == round(80 / 13.0, 1)
    assert out["rejected"] == {"flood/UNAVAILABLE": 1} and out["hung"] == 0


def test_its_flags_refuse_bad_values_by_name():
    parser = argparse.ArgumentParser()
    add_bench_fairness_args(parser)
    args = parser.parse_args(["--seeds", "0,1", "--duration", "30"])
    assert args.seeds == [0, 1] and args.duration == 30.0 and args.max_queue_s == 20.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--flood-users", "0"])
