"""`streamrag up --orchestrators N`: N orchestrators over one Redis, the gateway and `ask` spread over
them (the channel target and options), and the bounds of the flag."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from orchestrator.server_args import add_orchestrator_args
from servicekit.channels import spread_options, spread_target
from streamrag.stack import commands, plan


def up_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands.add_up_args(parser)
    return parser.parse_args(list(argv))


def flags(service: plan.Service) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_orchestrator_args(parser)
    return parser.parse_args(service.argv[service.argv.index("orchestrator") + 1:])


def test_one_orchestrator_by_default_and_n_over_the_same_redis_when_asked():
    default = plan.plan_stack(up_args(), Path("/i"), 6379)
    assert [s.name for s in default if s.kind == "orchestrator"] == ["orchestrator"]
    services = plan.plan_stack(up_args("--orchestrators", "3", "--replicas", str(plan.MAX_REPLICAS)), Path("/i"), 6379)
    orchestrators = [s for s in services if s.kind == "orchestrator"]
    assert [s.name for s in orchestrators] == ["orchestrator", "orchestrator-1", "orchestrator-2"]
    parsed = [flags(s) for s in orchestrators]
    assert len({args.redis for args in parsed}) == 1 and len({tuple(args.inference) for args in parsed}) == 1
    ports = [p for s in services for p in s.ports]
    assert len(ports) == len(set(ports))               # no orchestrator on a replica's or retriever's port
    gateway = next(s for s in services if s.kind == "gateway")
    assert gateway.argv[gateway.argv.index("--orchestrator") + 1] == ",".join(s.target for s in orchestrators)
    assert set(gateway.needs) == {s.name for s in orchestrators}


def test_the_flag_is_bounded():
    assert "--orchestrators" in commands.check_options(plan.StackOptions(orchestrators=0))
    assert "--orchestrators" in commands.check_options(plan.StackOptions(orchestrators=plan.MAX_ORCHESTRATORS + 1))


def test_several_addresses_make_one_round_robin_target_with_health_checking():
    assert spread_target("127.0.0.1:50051") == "127.0.0.1:50051"
    assert spread_target("127.0.0.1:50051, 127.0.0.1:50071") == "ipv4:127.0.0.1:50051,127.0.0.1:50071"
    assert spread_target("dns:///orchestrators:50051") == "dns:///orchestrators:50051"
    config = json.loads(dict(spread_options())["grpc.service_config"])
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    assert config["healthCheckConfig"] == {"serviceName": ""}
    assert config["methodConfig"][0]["waitForReady"] is True
