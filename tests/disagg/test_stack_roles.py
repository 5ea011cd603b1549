"""`streamrag up --prefill-replicas N --decode-replicas M`: the plan gives each replica its role, the
CLI accepts every planned command, and bad splits are refused before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path

from streamrag.cli import build_parser
from streamrag.stack import commands, plan


def up(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands.add_up_args(parser)
    return parser.parse_args(list(argv))


def roles(services) -> dict[str, str]:
    parser = build_parser()
    return {s.name: parser.parse_args(s.argv[3:]).role for s in services if s.kind == "inference"}


def test_a_split_plans_prefill_then_decode_replicas_and_the_orchestrator_knows_them_all():
    services = plan.plan_stack(up("--prefill-replicas", "1", "--decode-replicas", "2"), Path("/tmp/index"),
                               redis_port=6379)
    assert roles(services) == {"inference-0": "prefill", "inference-1": "decode", "inference-2": "decode"}
    orchestrator = next(s for s in services if s.name == "orchestrator")
    assert build_parser().parse_args(orchestrator.argv[3:]).inference == [
        s.target for s in services if s.kind == "inference"]


def test_without_a_split_every_replica_does_both():
    services = plan.plan_stack(up("--replicas", "2"), Path("/tmp/index"), redis_port=6379)
    assert roles(services) == {"inference-0": "both", "inference-1": "both"}


def test_bad_splits_are_refused_with_a_message():
    assert "both be 1 or more" in commands.check_options(plan.StackOptions(prefill_replicas=1))
    assert "both be 1 or more" in commands.check_options(plan.StackOptions(prefill_replicas=5, decode_replicas=5))
    assert commands.check_options(plan.StackOptions(prefill_replicas=1, decode_replicas=1)) is None
    # both backends hand off (docs/vllm.md, "Disaggregated prefill and decode")
    assert commands.check_options(plan.StackOptions(prefill_replicas=1, decode_replicas=1, backend="vllm")) is None
