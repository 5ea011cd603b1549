"""compose/docker-compose.yml and deploy/k8s/base agree: services, commands, ports, environment keys,
health checks.

Each compose service has its workload in the base (the numbered copies, inference-0/-1 and
orchestrator/-1, are one Deployment with that many replicas), running the same module with the same
flags and values, on the same ports, with the same environment keys and its persistent paths on a
volume claim. The differences are written down below, each with its reason: the addresses the
cluster gives (`ADDRESSES`) and the flags only the cluster needs (`K8S_ONLY_FLAGS`); anything else
that differs fails. The overrides (TLS, disagg, Milvus) are compared with their overlays where
kubectl is installed.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from servicekit.config import env_name, metrics_port_for
from tests.deploy import manifests as m

COMPOSE = m.ROOT / "compose"
SENTINELS = ("redis+sentinel://redis-sentinel-0.redis-sentinel:26379,redis-sentinel-1.redis-sentinel:26379,"
             "redis-sentinel-2.redis-sentinel:26379/mymaster/0")
# compose service -> (kind, name) of its workload in the base.
WORKLOAD = {
    "redis": ("StatefulSet", "redis"), "corpus": ("Deployment", "corpus"), "anns": ("StatefulSet", "anns"),
    "crawler": ("Deployment", "crawler"), "inference-0": ("Deployment", "inference"),
    "inference-1": ("Deployment", "inference"), "orchestrator": ("Deployment", "orchestrator"),
    "orchestrator-1": ("Deployment", "orchestrator"), "gateway": ("Deployment", "gateway"),
}
# Workloads compose has no counterpart of: the Sentinels (compose runs one Redis, no failover).
K8S_ONLY_WORKLOADS = {"redis-sentinel"}
# (workload, flag): (compose's values, the base's values). The cluster's addresses: Redis through its
# Sentinels, the replicas found by DNS behind the headless Service, the orchestrators' headless Service.
ADDRESSES = {
    ("orchestrator", "--redis"): (["redis://redis:6379/0"], [SENTINELS]),
    ("orchestrator", "--inference"): (["inference-0:50052", "inference-1:50052"], ["dns:///inference:50052"]),
    ("gateway", "--orchestrator"): (["dns:///orchestrators:50051"], ["dns:///orchestrator:50051"]),
}
# Flags only the base passes: the ANNS index on the StatefulSet's volume, built there if incomplete
# (compose uses the index inside the image); a long drain for the services that carry answers, so a
# rolling update lets them finish (terminationGracePeriodSeconds covers it; compose stops in 15 s).
K8S_ONLY_FLAGS = {"anns": {"--index": ["/data/index"], "--build-from": ["/usr/share/doc/python3.11/html"]},
                  "inference": {"--grace": ["120"]}, "orchestrator": {"--grace": ["120"]}}
# Containers started through a wrapper that runs the compose command given as its arguments.
WRAPPERS = {"redis": ["sh", "/scripts/start-redis.sh"]}
# The metrics port of each service (servicekit.config; the crawler takes its own, retriever_svc/server.py).
METRICS = {"anns": metrics_port_for("anns"), "crawler": metrics_port_for("crawler"),
           "inference": metrics_port_for("inference"), "orchestrator": metrics_port_for("orchestrator")}


def compose_file(name: str = "docker-compose.yml") -> dict:
    return yaml.safe_load((COMPOSE / name).read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, dict]:
    return compose_file()["services"]


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return m.base_objects()


def command_drift(service: str, compose_argv: list[str], k8s_argv: list[str]) -> list[str]:
    """How the base's command differs from compose's, beyond the differences written down above."""
    workload = WORKLOAD[service][1]
    wrapper = WRAPPERS.get(workload)
    if wrapper is not None:
        if k8s_argv[:len(wrapper)] != wrapper:
            return [f"{workload}: not started by {wrapper}"]
        return [] if k8s_argv[len(wrapper):] == compose_argv else [f"{workload}: {k8s_argv} != {compose_argv}"]
    if k8s_argv[:3] != compose_argv[:3]:
        return [f"{workload}: runs {k8s_argv[:3]}, compose {compose_argv[:3]}"]
    want, got = m.flags(compose_argv[3:]), m.flags(k8s_argv[3:])
    drift = []
    for (name, flag), (compose_values, k8s_values) in ADDRESSES.items():
        if name != workload:
            continue
        if want.get(flag) != compose_values:
            drift.append(f"compose {service} {flag} {want.get(flag)}, the parity table expects {compose_values}")
        want[flag] = k8s_values
    want.update(K8S_ONLY_FLAGS.get(workload, {}))
    for flag in sorted(set(want) | set(got)):
        if want.get(flag) != got.get(flag):
            drift.append(f"{workload} {flag}: compose {want.get(flag)}, base {got.get(flag)}")
    return drift


def test_every_compose_service_has_its_workload_and_no_other(compose, base) -> None:
    assert set(compose) == set(WORKLOAD)
    names = {o["metadata"]["name"] for o in m.workloads(base)}
    assert names == {name for _, name in WORKLOAD.values()} | K8S_ONLY_WORKLOADS
    for kind, name in WORKLOAD.values():
        m.find(base, kind, name)


def test_replica_counts_are_the_numbered_compose_services(compose, base) -> None:
    for name in ("inference", "orchestrator"):
        copies = [s for s in compose if WORKLOAD[s][1] == name]
        assert m.find(base, "Deployment", name)["spec"]["replicas"] == len(copies) >= 2, name
        commands = {tuple(compose[s]["command"]) for s in copies}
        assert len(commands) == 1, f"compose's {copies} differ: one Deployment cannot run both"


def test_commands_agree(compose, base) -> None:
    drift = []
    for service, (kind, name) in WORKLOAD.items():
        drift += command_drift(service, compose[service]["command"], m.argv(m.container(base, kind, name)))
    assert not drift, "\n".join(drift)


def test_a_changed_flag_is_drift(compose, base) -> None:
    """The comparison itself: a flag changed, added or dropped on either side is reported."""
    c = m.argv(m.container(base, "Deployment", "inference"))
    changed = copy.deepcopy(compose["inference-0"]["command"])
    changed[changed.index("fcfs")] = "lcas"
    assert command_drift("inference-0", changed, c)
    assert command_drift("inference-0", [*compose["inference-0"]["command"], "--max-running", "8"], c)
    o = m.argv(m.container(base, "Deployment", "orchestrator"))
    moved = [w.replace("redis://redis:6379/0", "redis://cache:6379/0") for w in compose["orchestrator"]["command"]]
    assert command_drift("orchestrator", moved, o)
    assert command_drift("orchestrator", compose["orchestrator"]["command"], o[:-2])      # --crawler dropped
    r = m.argv(m.container(base, "StatefulSet", "redis"))
    assert command_drift("redis", [*compose["redis"]["command"], "--maxmemory", "1gb"], r)


def test_environment_keys_agree(compose, base) -> None:
    for service, (kind, name) in WORKLOAD.items():
        keys = set(compose[service].get("environment") or {})
        assert m.env_names(m.container(base, kind, name)) == keys, service


def test_ports_agree(compose, base) -> None:
    for service, (kind, name) in WORKLOAD.items():
        c = m.container(base, kind, name)
        command = compose[service]["command"]
        if name == "redis":
            assert m.port(c, "redis") == 6379
            continue
        listen = int(m.flags(command[3:])["--port"][0])
        served = m.port(c, "http" if name in ("corpus", "gateway") else "grpc")
        assert served == listen, f"{name}: container port {served}, compose --port {listen}"
        service_ports = {p["name"]: p for p in m.find(base, "Service", name)["spec"]["ports"]}
        front = service_ports["http" if name in ("corpus", "gateway") else "grpc"]
        assert front["targetPort"] in ("http", "grpc", listen)
        if name != "gateway":                   # the gateway's Service is port 80, as a load balancer's is
            assert front["port"] == listen, name
        if name in METRICS:
            assert m.port(c, "metrics") == METRICS[name] == service_ports["metrics"]["port"], name
    published = compose["gateway"]["ports"]
    assert [p.rsplit(":", 1)[1] for p in published] == ["8000"]
    assert [s["metadata"]["name"] for s in base if s["kind"] == "Service"
            and s["spec"].get("type") in ("LoadBalancer", "NodePort")] == ["gateway"]


def test_images_agree(compose, base) -> None:
    for service, (kind, name) in WORKLOAD.items():
        image = m.container(base, kind, name)["image"]
        wanted = compose[service]["image"]
        if service == "redis":       # compose's ${STREAMRAG_REDIS_IMAGE:-redis:7-alpine}: the same image, major 7
            default = re.search(r":-([^}]+)}", wanted).group(1)
            assert image.split(":")[0] == default.split(":")[0] == "redis"
            assert image.split(":")[1].split(".")[0].split("-")[0] == default.split(":")[1].split("-")[0]
        else:
            assert image == wanted, service


def test_persistent_paths_are_on_volume_claims(compose, base) -> None:
    """compose's named volumes hold what must outlive a container: on the cluster, a StatefulSet's claim."""
    for service, (kind, name) in WORKLOAD.items():
        for volume in compose[service].get("volumes", []):
            path = volume.split(":")[1]
            workload = m.find(base, kind, name)
            claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
            mounts = [v for v in m.container(base, kind, name).get("volumeMounts", [])
                      if v["name"] in claims and (path + "/").startswith(v["mountPath"].rstrip("/") + "/")]
            assert mounts, f"{name}: {path} is not on a PersistentVolumeClaim"


# ---- the overrides and their overlays (kubectl builds them) ----

needs_kubectl = pytest.mark.skipif(m.KUBECTL is None, reason=m.NO_KUBECTL)

# The TLS override's file names, and the tls component's keys of the Secret `<service>-tls`.
TLS_FILES = {".crt": "tls.crt", ".key": "tls.key", "ca.crt": "ca.crt"}


def tls_file(compose_path: str) -> str:
    name = Path(compose_path).name
    return "ca.crt" if name == "ca.crt" else TLS_FILES[Path(name).suffix]


@needs_kubectl
def test_tls_override_and_component_agree() -> None:
    override = compose_file("docker-compose.tls.yml")["services"]
    built = m.build(m.K8S / "overlays" / "tls")
    for service, spec in override.items():
        kind, name = WORKLOAD[service]
        c = m.container(built, kind, name)
        env = {e["name"]: e.get("value") for e in c["env"]}
        base_keys = set(compose_file()["services"][service].get("environment") or {})
        assert set(env) - base_keys == set(spec["environment"]), service
        for key, value in spec["environment"].items():
            assert env[key] == f"/etc/streamrag/tls/{tls_file(value)}", (service, key)
        volumes = {v["name"]: v for v in m.pod_spec(m.find(built, kind, name))["volumes"]}
        mount = next(v for v in c["volumeMounts"] if v["mountPath"] == "/etc/streamrag/tls")
        assert mount.get("readOnly") is True
        assert volumes[mount["name"]]["secret"]["secretName"] == f"{name}-tls"
    # each service's own variables (servicekit/tls.py: env_name(SERVICE, "tls_cert"), ...)
    for name, service in (("inference", "inference"), ("orchestrator", "orchestrator"), ("gateway", "gateway"),
                          ("crawler", "retriever")):
        keys = m.env_names(m.container(built, "Deployment", name))
        assert {env_name(service, k) for k in ("tls_cert", "tls_key", "tls_ca")} <= keys, name


@needs_kubectl
def test_disagg_override_and_overlay_agree() -> None:
    override = compose_file("docker-compose.disagg.yml")["services"]
    built = m.build(m.K8S / "overlays" / "disagg")
    roles = {spec["environment"]["STREAMRAG_INFERENCE_ROLE"] for spec in override.values()}
    assert roles == {"prefill", "decode"}
    for role in roles:
        pool = m.find(built, "Deployment", f"inference-{role}")
        c = m.pod_spec(pool)["containers"][0]
        assert {e["name"]: e["value"] for e in c["env"]} == {"STREAMRAG_INFERENCE_ROLE": role}
        assert pool["spec"]["replicas"] == sum(
            1 for spec in override.values() if spec["environment"]["STREAMRAG_INFERENCE_ROLE"] == role)
        assert m.argv(c) == m.argv(m.container(m.base_objects(), "Deployment", "inference"))
    assert not [o for o in built if o["kind"] == "Deployment" and o["metadata"]["name"] == "inference"]


@needs_kubectl
def test_milvus_override_and_overlay_agree() -> None:
    anns = compose_file("docker-compose.milvus.yml")["services"]["anns"]
    base_argv = compose_file()["services"]["anns"]["command"]
    built = m.container(m.build(m.K8S / "overlays" / "milvus"), "StatefulSet", "anns")
    added_compose = {k: v for k, v in m.flags(anns["command"][3:]).items() if k not in m.flags(base_argv[3:])}
    added_k8s = {k: v for k, v in m.flags(m.argv(built)[3:]).items()
                 if k not in m.flags(m.argv(m.container(m.base_objects(), "StatefulSet", "anns"))[3:])}
    assert set(added_compose) == set(added_k8s) == {"--backend", "--milvus-uri"}
    assert added_compose["--backend"] == added_k8s["--backend"] == ["milvus"]
    assert re.fullmatch(r"http://[a-z0-9.-]+:19530", added_k8s["--milvus-uri"][0])
    assert built["image"].split(":")[0] == anns["image"]


def test_health_checks_agree(compose, base) -> None:
    """Each compose health check and the workload's readiness probe ask the same thing of the same port."""
    for service, (kind, name) in WORKLOAD.items():
        test = compose[service]["healthcheck"]["test"]
        probe = m.container(base, kind, name)["readinessProbe"]
        if test[:2] == ["CMD", "redis-cli"]:
            assert probe["exec"]["command"] == test[1:], service
            continue
        assert test[1:4] == ["python", "-m", "servicekit.health"], service
        check, target = test[4], test[5]
        if check == "grpc":
            assert probe["grpc"]["port"] == int(target.rsplit(":", 1)[1]), service
        else:
            url = re.fullmatch(r"http://127\.0\.0\.1:(\d+)(/.*)", target)
            c = m.container(base, kind, name)
            assert probe["httpGet"]["path"] == url.group(2), service
            assert m.port(c, probe["httpGet"]["port"]) == int(url.group(1)), service
