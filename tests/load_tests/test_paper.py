"""`bench paper`: every step is a valid `bench replay` over a trace it synthesizes, with the seeds named."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from load_tests.paper import STEPS, TRACES, replay_argv, synth_argv
from load_tests.replay import add_bench_replay_args
from load_tests.trace_synth import add_trace_synth_args


def parse(add_args, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_args(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("step", STEPS)
def test_each_step_is_a_replay_of_a_known_trace_over_the_seeds(step):
    args = parse(add_bench_replay_args, replay_argv(step, Path("out/x"), [0, 1, 2]))
    assert args.seeds == [0, 1, 2] and args.out == Path("out/x") / step
    assert args.trace.name in TRACES and args.token_budget == 256


@pytest.mark.parametrize("name", TRACES)
def test_each_trace_is_a_valid_synth_command(name):
    args = parse(add_trace_synth_args, synth_argv(name, Path("out/x"), Path("p.sqlite")))
    assert args.out == Path("out/x") / name and args.passages == Path("p.sqlite")
