"""What the benchmark CLIs share (load_tests/runner.py): a bad list or number is an argparse error with the
flag's name, never a traceback; --json writes its folder too; the CPU lock is held once per bench."""

from __future__ import annotations

import argparse
import json

import pytest

from load_tests import blend_bench, gateway_bench, ingest_bench, retrieval_bench, step_budget_bench
from load_tests.concurrent_bench import add_bench_concurrent_args
from load_tests.decode_bench import add_bench_decode_args
from load_tests.disagg_bench import add_bench_disagg_args
from load_tests.gpu_bench import add_bench_gpu_args
from load_tests.runner import (
    choice_list,
    fraction_list,
    int_list,
    positive_float,
    positive_float_list,
    positive_int,
    positive_int_list,
    spread,
    write_json,
)
from load_tests.sessions_bench import add_bench_sessions_args


def test_lists_and_numbers_parse():
    assert int_list("0,1, 2") == [0, 1, 2]
    assert positive_int_list("1,8") == [1, 8]
    assert positive_int("3") == 3 and positive_float("0.5") == 0.5
    assert positive_float_list("0.25, 1") == [0.25, 1.0]
    assert choice_list(("a", "b"))("b,a") == ["b", "a"]
    assert fraction_list("0,0.15,1") == [0.0, 0.15, 1.0]


def test_spread_is_the_median_with_min_and_max():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert spread([0.12345, 0.5], digits=2) == {"median": 0.31, "min": 0.12, "max": 0.5}


@pytest.mark.parametrize("parse, text", [
    (int_list, ""), (int_list, "0,,1"), (int_list, "a"), (int_list, "-1"), (int_list, "1.5"),
    (positive_int_list, "0,1"), (positive_int, "0"), (positive_int, "x"),
    (positive_float, "0"), (positive_float, "nan"), (positive_float, "inf"), (positive_float, "x"),
    (positive_float_list, "0.5,0"), (positive_float_list, "0.5 1"), (choice_list(("a", "b")), "a,c"),
    (fraction_list, "0.5,1.01"), (fraction_list, "-0.1"), (fraction_list, "nan"), (fraction_list, "0.5 1"),
])
def test_bad_values_are_argument_errors(parse, text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse(text)


def test_the_suite_runs_benches_without_the_cpu_lock(tmp_path):
    """A test never waits on a user's benchmark: the suite sets STREAMRAG_CPU_LOCK=off (tests/conftest.py,
    inherited by every bench a test starts, in-process or as a subprocess), and then no lock file is opened."""
    import os

    from load_tests.runner import CPU_LOCK_ENV, CPU_LOCKED_ENV, cpu_lock

    assert os.environ[CPU_LOCK_ENV] == "off"
    path = tmp_path / "cpu.lock"
    with cpu_lock(path):
        assert CPU_LOCKED_ENV not in os.environ
    assert not path.exists()


@pytest.mark.parametrize("add_args, argv", [
    (add_bench_concurrent_args, ["--seeds", "0,x"]),
    (add_bench_decode_args, ["--concurrency", "0,8"]),
    (add_bench_sessions_args, ["--points", "1000,abc"]),
    (add_bench_disagg_args, ["--modes", "colocated,both"]),
    (add_bench_disagg_args, ["--rates", "0.25 0.5"]),
    (blend_bench.add_args, ["--fractions", "0.1,1.5", "--json", "x.json"]),
    (add_bench_gpu_args, ["--concurrency", "1,0"]),
])
def test_a_bench_cli_names_the_bad_flag(add_args, argv, capsys):
    parser = argparse.ArgumentParser(prog="streamrag bench")
    add_args(parser)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(argv)
    assert exited.value.code == 2
    assert f"argument {argv[0]}" in capsys.readouterr().err


def test_write_json_creates_the_folder(tmp_path):
    path = tmp_path / "a" / "b" / "out.json"
    write_json(path, {"rows": [1, 2]})
    assert json.loads(path.read_text()) == {"rows": [1, 2]}
    assert path.read_text().endswith("\n")


def test_the_cpu_lock_is_held_for_the_block_and_not_taken_twice(tmp_path, monkeypatch):
    import fcntl
    import os

    from load_tests.runner import CPU_LOCK_ENV, CPU_LOCKED_ENV, cpu_lock

    monkeypatch.delenv(CPU_LOCKED_ENV, raising=False)
    monkeypatch.delenv(CPU_LOCK_ENV)            # the suite's "off", lifted for this lock on a tmp path
    path = tmp_path / "cpu.lock"
    with cpu_lock(path):
        assert os.environ[CPU_LOCKED_ENV] == "1"          # what a bench's subprocesses inherit
        with open(path) as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)   # another open file (another bench) waits
        with cpu_lock(path):                               # a nested bench does not wait for itself
            pass
    assert CPU_LOCKED_ENV not in os.environ
    with open(path) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again


@pytest.mark.parametrize("add_args, argv", [
    (add_bench_concurrent_args, []), (add_bench_decode_args, []), (add_bench_sessions_args, []),
    (add_bench_disagg_args, []), (blend_bench.add_args, ["--json", "x.json"]),
    (gateway_bench.add_bench_gateway_args, []), (ingest_bench.add_bench_ingest_args, []),
    (retrieval_bench.add_args, []), (step_budget_bench.add_bench_steps_args, []),
])
def test_every_seeded_bench_names_its_seeds_the_same_way(add_args, argv):
    """`--seeds 0,1,2` by default, and a list given is the seeds run (not a count)."""
    parser = argparse.ArgumentParser(prog="streamrag bench")
    add_args(parser)
    assert parser.parse_args(argv).seeds == [0, 1, 2]
    assert parser.parse_args([*argv, "--seeds", "4,7"]).seeds == [4, 7]
