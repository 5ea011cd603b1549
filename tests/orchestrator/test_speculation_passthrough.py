"""`streamrag ask` sends the speculation setting (one default, from inference_svc/engine/options.py)
and the orchestrator passes it to the inference service unchanged."""

from __future__ import annotations

import argparse

import pytest

from inference_svc.engine.options import DEFAULT_SPECULATION
from orchestrator.ask import validate_ask
from protos import common_pb2, orchestrator_pb2
from streamrag.ask import add_ask_args


def ask_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_ask_args(parser)
    return parser


def test_ask_sends_the_default_unless_told_otherwise():
    assert ask_parser().parse_args(["q"]).speculation == DEFAULT_SPECULATION
    assert ask_parser().parse_args(["q", "--speculation", "off"]).speculation == "off"
    assert ask_parser().parse_args(["q", "--speculation", "4"]).speculation == "4"


@pytest.mark.parametrize("bad", ["-1", "17", "eagle"])
def test_ask_refuses_a_bad_setting(bad, capsys):
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        ask_parser().parse_args(["q", "--speculation", bad])


@pytest.mark.parametrize("speculation", ["off", "auto", "8", ""])
def test_the_orchestrator_passes_speculation_through(speculation):
    request = orchestrator_pb2.AskRequest(question="how do I read a file?",
                                          sampling=common_pb2.SamplingParams(speculation=speculation))
    settings = validate_ask(request, {"anns"})
    assert settings.sampling.speculation == speculation     # "" leaves the choice to the inference service
