"""deploy/k8s/ builds and validates, and its objects have the shape the cluster needs.

Every overlay, alone and with the components (each alone, and together), is built with
`kubectl kustomize` and checked with `kubernetes-validate --strict -k 1.32.0`: no error, and warnings
only for the custom resources it has no schema for (KEDA's ScaledObject, the Prometheus operator's
ServiceMonitor). Then what the built objects must say: only the gateway is reachable from outside,
every container has readiness and liveness probes (gRPC-native where the service speaks gRPC), the
orchestrators find the replicas and Redis's Sentinels by the names the manifests give them, and each
overlay and component does what it is for. Every container command is parsed by the service's own
flags. Skipped, with the reason, where kubectl or kubernetes-validate is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from gateway.server_args import add_gateway_args
from inference_svc.server_args import add_inference_args
from orchestrator.discovery import split_targets
from orchestrator.server_args import add_orchestrator_args
from retriever_svc.corpus.web_server import add_serve_corpus_args
from retriever_svc.server_args import add_retriever_args
from servicekit.config import ServiceConfig
from tests.deploy import manifests as m

pytestmark = pytest.mark.skipif(m.KUBECTL is None, reason=m.NO_KUBECTL)

VALIDATOR = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
CUSTOM_KINDS = {"ScaledObject", "ServiceMonitor"}
GRPC = {"anns": 50061, "crawler": 50062, "inference": 50052, "orchestrator": 50051}
# Every build checked: the overlays, the cpu overlay with each component, disagg with TLS, and all at once.
TARGETS: dict[str, tuple[str, list[str]]] = {
    **{overlay: (overlay, []) for overlay in m.OVERLAYS},
    **{f"cpu+{c}": ("cpu", [c]) for c in (*m.COMPONENTS, "grafana") if c not in ("vllm", "gpu")},
    "gpu+vllm+keda": ("gpu", ["vllm", "keda"]),
    "disagg+tls": ("disagg", ["tls", "prometheus-annotations"]),
    "disagg+gpu": ("disagg", ["gpu", "vllm"]),
    "cpu+all": ("cpu", ["tls", "keda", "servicemonitor", "prometheus-annotations", "grafana"]),
}
MODULES = {
    "retriever_svc.corpus.web_server": add_serve_corpus_args, "retriever_svc.server": add_retriever_args,
    "inference_svc.server": add_inference_args, "orchestrator.server": add_orchestrator_args,
    "gateway.server": add_gateway_args,
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, list[dict]]:
    out = {}
    for label, (overlay, components) in TARGETS.items():
        target = m.K8S / "overlays" / overlay
        if components:
            target = m.compose_target(tmp_path_factory.mktemp(label.replace("+", "-")), overlay, components)
        out[label] = m.build(target)
    return out


@pytest.fixture(scope="module")
def validation(built, tmp_path_factory) -> dict[str, list[str]]:
    """kubernetes-validate's output lines per target (one run over every built file)."""
    if not Path(VALIDATOR).exists():
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[dev]')")
    import yaml

    folder = tmp_path_factory.mktemp("built")
    files = {}
    for label, objects in built.items():
        files[label] = folder / f"{label}.yaml"
        files[label].write_text(yaml.safe_dump_all(objects))
    result = subprocess.run([VALIDATOR, "--strict", "-k", "1.32.0", "--quiet", *map(str, files.values())],
                            capture_output=True, text=True, timeout=300)
    lines = (result.stdout + result.stderr).splitlines()
    out = {label: [line for line in lines if f" {path} " in line] for label, path in files.items()}
    out["__rc__"] = [str(result.returncode)]
    return out


def parse(c: dict) -> argparse.Namespace:
    """The container's command as its service would parse it, with the container's literal environment
    (the flags' `STREAMRAG_*` defaults); fails the test where it would not parse."""
    argv = m.argv(c)
    assert argv[:2] == ["python", "-m"] and argv[2] in MODULES, argv
    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    with mock.patch.dict(os.environ, env):
        parser = argparse.ArgumentParser()
        MODULES[argv[2]](parser)
        try:
            return parser.parse_args(argv[3:])
        except SystemExit:
            pytest.fail(f"python -m {argv[2]} does not accept {argv[3:]}")


def python_containers(objects: list[dict]) -> list[tuple[dict, dict]]:
    return [(w, c) for w in m.workloads(objects) for c in m.pod_spec(w)["containers"]
            if c.get("command", [])[:2] == ["python", "-m"]]


@pytest.mark.parametrize("label", list(TARGETS), ids=[f"build-{label}" for label in TARGETS])
def test_builds_and_validates_strictly(label, built, validation) -> None:
    lines = validation[label]
    errors = [line for line in lines if line.startswith("ERROR")]
    assert not errors, "\n".join(errors)
    for line in lines:
        assert line.startswith("WARN") and any(f"kind {kind} " in line for kind in CUSTOM_KINDS), line
    kinds = {o["kind"] for o in built[label]}
    assert len(lines) == sum(1 for o in built[label] if o["kind"] in CUSTOM_KINDS)
    assert {"Deployment", "StatefulSet", "Service"} <= kinds


def test_validation_fails_a_bad_manifest(tmp_path, validation) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: 80}]\n"
                   "  clusterIp: None\n")         # a misspelt field: strict validation rejects it
    result = subprocess.run([VALIDATOR, "--strict", "-k", "1.32.0", "--quiet", str(bad)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "clusterIp" in result.stdout + result.stderr
    assert validation["__rc__"] == ["0"]


@pytest.mark.parametrize("label", list(TARGETS), ids=[f"build-{label}" for label in TARGETS])
def test_only_the_gateway_is_exposed(label, built) -> None:
    exposed = [o["metadata"]["name"] for o in built[label] if o["kind"] == "Service"
               and (o["spec"].get("type") in ("LoadBalancer", "NodePort") or o["spec"].get("externalIPs"))]
    assert exposed == ["gateway"]
    assert not [o for o in built[label] if o["kind"] in ("Ingress", "Gateway", "HTTPRoute")]
    for w in m.workloads(built[label]):
        assert not m.pod_spec(w).get("hostNetwork")
        assert not [p for c in m.pod_spec(w)["containers"] for p in c.get("ports", []) if "hostPort" in p]


@pytest.mark.parametrize("label", list(TARGETS), ids=[f"build-{label}" for label in TARGETS])
def test_every_container_has_probes_and_every_command_parses(label, built) -> None:
    objects = built[label]
    for w in m.workloads(objects):
        assert any(s in w["metadata"]["name"] for s in
                   ("redis", "corpus", "anns", "crawler", "inference", "orchestrator", "gateway"))
        for c in m.pod_spec(w)["containers"]:
            assert "readinessProbe" in c and "livenessProbe" in c, (w["metadata"]["name"], c["name"])
    for w, c in python_containers(objects):
        args = parse(c)
        assert args.host == "0.0.0.0"
        grace = getattr(args, "grace", ServiceConfig(service="x").grace_s)
        assert m.pod_spec(w)["terminationGracePeriodSeconds"] >= grace + 10, w["metadata"]["name"]
        if w["metadata"]["name"].startswith(("inference", "orchestrator")):
            assert grace >= 60, "a stopping replica or orchestrator must have time to finish its answers"


def test_probes_are_grpc_native_where_the_service_speaks_grpc(built) -> None:
    objects = built["cpu"]
    for name, port in GRPC.items():
        kind = "StatefulSet" if name == "anns" else "Deployment"
        c = m.container(objects, kind, name)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": port}, (name, probe)
        assert m.port(c, "grpc") == port
    gateway = m.container(objects, "Deployment", "gateway")
    assert gateway["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert gateway["readinessProbe"]["httpGet"]["path"] == gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    inference = m.container(objects, "Deployment", "inference")
    startup = inference["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600      # the model load


def test_the_orchestrators_find_the_replicas_redis_and_retrievers_by_the_manifests_names(built) -> None:
    objects = built["cpu"]
    args = parse(m.container(objects, "Deployment", "orchestrator"))
    static, (found,) = split_targets(args.inference)          # the orchestrator's own reading
    assert static == [] and found.server is None              # the pod's resolver, as a headless Service needs
    name, port = found.name, found.port
    service = m.find(objects, "Service", name)
    assert "inference" in name and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == m.find(objects, "Deployment", "inference")["spec"]["selector"]["matchLabels"]
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    for flag, kind in (("anns", "StatefulSet"), ("crawler", "Deployment")):
        host, port = getattr(args, flag).split(":")
        assert int(port) in {p["port"] for p in m.find(objects, "Service", host)["spec"]["ports"]}
        m.find(objects, kind, host)
    # redis+sentinel://HOST:PORT[,HOST:PORT]/MASTER/DB: every Sentinel pod, the master the script monitors
    hosts, master, db = re.fullmatch(r"redis\+sentinel://([^/]+)/([^/]+)/(\d+)", args.redis).groups()
    sentinels = m.find(objects, "StatefulSet", "redis-sentinel")
    assert sentinels["spec"]["replicas"] == 3 and m.find(objects, "StatefulSet", "redis")["spec"]["replicas"] == 2
    governing = sentinels["spec"]["serviceName"]
    assert hosts.split(",") == [f"redis-sentinel-{i}.{governing}:26379" for i in range(3)]
    scripts = m.find(objects, "ConfigMap", "redis-scripts")["data"]
    assert f"sentinel monitor {master} " in scripts["start-sentinel.sh"] and db == "0"
    assert f"get-master-addr-by-name {master}" in scripts["start-redis.sh"]
    (wait,) = m.pod_spec(m.find(objects, "Deployment", "orchestrator"))["initContainers"]
    assert f'"redis-sentinel-$i.{governing}" -p 26379' in wait["command"][-1]
    assert f"get-master-addr-by-name {master}" in wait["command"][-1]
    gateway = parse(m.container(objects, "Deployment", "gateway"))
    name, port = re.fullmatch(r"dns:///([a-z0-9-]+):(\d+)", gateway.orchestrator).groups()
    service = m.find(objects, "Service", name)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"]["app.kubernetes.io/name"] == "orchestrator"


def test_state_is_on_volume_claims(built) -> None:
    objects = built["cpu"]
    for name, path in (("anns", "/data"), ("redis", "/data")):
        workload = m.find(objects, "StatefulSet", name)
        claims = {t["metadata"]["name"] for t in workload["spec"]["volumeClaimTemplates"]}
        mounts = {v["mountPath"]: v["name"] for v in m.container(objects, "StatefulSet", name)["volumeMounts"]}
        assert mounts[path] in claims, name
    anns = parse(m.container(objects, "StatefulSet", "anns"))
    assert str(anns.index).startswith("/data/") and str(anns.collections).startswith("/data/")
    assert anns.build_from is not None          # an index build cut short resumes on the volume


def test_disruption_budgets_and_autoscalers(built) -> None:
    objects = built["cpu"]
    budgets = {o["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] for o in objects
               if o["kind"] == "PodDisruptionBudget"}
    assert {"orchestrator", "gateway", "inference"} <= budgets
    scaled = {o["spec"]["scaleTargetRef"]["name"] for o in objects if o["kind"] == "HorizontalPodAutoscaler"}
    assert scaled == {"gateway", "orchestrator"}
    keda = [o for o in built["cpu+keda"] if o["kind"] == "ScaledObject"]
    assert len(keda) == 1 and keda[0]["spec"]["scaleTargetRef"]["name"] == "inference"
    (trigger,) = keda[0]["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["query"] == "sum(vllm:num_requests_waiting)"
    hpa = m.find(built["cpu+inference-hpa"], "HorizontalPodAutoscaler", "inference")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    monitors = [o for o in built["cpu+servicemonitor"] if o["kind"] == "ServiceMonitor"]
    ports = {e["port"] for o in monitors for e in o["spec"]["endpoints"]}
    assert ports == {"metrics", "http"}
    for w, c in python_containers(built["cpu+prometheus-annotations"]):
        if w["metadata"]["name"] == "corpus":
            continue
        annotations = w["spec"]["template"]["metadata"]["annotations"]
        scraped = int(annotations["prometheus.io/port"])
        assert scraped in {p["containerPort"] for p in c["ports"]}, w["metadata"]["name"]


def test_gpu_and_vllm(built) -> None:
    pools = [("disagg+gpu", f"inference-{role}") for role in ("prefill", "decode")]
    for label, name in [("gpu", "inference"), ("gpu-vllm", "inference"), *pools]:
        c = m.container(built[label], "Deployment", name)
        args = parse(c)
        assert args.device == "cuda" and c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        vllm = label in ("gpu-vllm", "disagg+gpu")
        assert args.backend == ("vllm" if vllm else "native")
        image = "streamrag-inference-vllm" if vllm else "streamrag-inference-cuda"
        assert c["image"].split(":")[0] == image


def test_tls_mounts_each_services_secret_and_probes_over_tls(built) -> None:
    for label in ("tls", "disagg+tls"):
        objects = built[label]
        for w, c in python_containers(objects):
            name = w["metadata"]["name"]
            service = c["name"]
            if service == "corpus":
                continue                       # plaintext, as in compose (a NetworkPolicy admits the crawler only)
            args = parse(c)
            assert args.tls_cert == "/etc/streamrag/tls/tls.crt" and args.tls_ca == "/etc/streamrag/tls/ca.crt"
            volumes = {v["name"]: v for v in m.pod_spec(w)["volumes"]}
            mount = next(v for v in c["volumeMounts"] if v["mountPath"] == "/etc/streamrag/tls")
            assert volumes[mount["name"]]["secret"]["secretName"] == f"{service}-tls", name
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if service == "gateway":
                    assert c[probe]["httpGet"]["scheme"] == "HTTPS"
                else:
                    assert c[probe]["exec"]["command"][:4] == ["python", "-m", "servicekit.health", "grpc"]
                    assert c[probe]["exec"]["command"][4] == f"127.0.0.1:{GRPC[service]}"
        policies = {o["metadata"]["name"] for o in objects if o["kind"] == "NetworkPolicy"}
        assert policies == {"redis", "redis-sentinel", "corpus"}


def test_grafana_dashboard_reads_exported_metrics(built) -> None:
    path = m.K8S / "grafana" / "streamrag-dashboard.json"
    dashboard = json.loads(path.read_text())
    (config_map,) = [o for o in built["cpu+grafana"] if o["kind"] == "ConfigMap" and "grafana_dashboard" in
                     o["metadata"].get("labels", {})]
    assert json.loads(config_map["data"]["streamrag-dashboard.json"]) == dashboard
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    names = set(re.findall(r"\b(streamrag_[a-z_]+|vllm:[a-z_]+)", exprs))
    source = " ".join(p.read_text() for d in ("inference_svc", "orchestrator", "retriever_svc", "gateway")
                      for p in (m.ROOT / d).rglob("*.py"))
    for name in names:
        bare = re.sub(r"_(bucket|total|count|sum)$", "", name)     # prometheus_client's suffixes
        assert f'"{bare}"' in source, f"{name}: no service exports it"
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
            "vllm:num_preemptions_total"} <= names
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("ttft", "streaming", "queue", "kv", "preemption", "resume", "retriever"):
        assert topic in titles, topic


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_redis_start_scripts_are_posix_shell(built, tmp_path) -> None:
    """The official redis image's Alpine shell runs them: `sh -n` parses each (the Sentinel's file too)."""
    scripts = m.find(built["cpu"], "ConfigMap", "redis-scripts")["data"]
    for name, text in scripts.items():
        path = tmp_path / name
        path.write_text(text)
        result = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"{name}: {result.stderr}"
    for statefulset, script in (("redis", "start-redis.sh"), ("redis-sentinel", "start-sentinel.sh")):
        c = m.pod_spec(m.find(built["cpu"], "StatefulSet", statefulset))["containers"][0]
        assert c["command"] == ["sh", f"/scripts/{script}"]
        mount = next(v for v in c["volumeMounts"] if v["mountPath"] == "/scripts")
        volumes = {v["name"]: v for v in m.pod_spec(m.find(built["cpu"], "StatefulSet", statefulset))["volumes"]}
        assert volumes[mount["name"]]["configMap"]["name"] == "redis-scripts"


def selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels and matchExpressions) against an object's labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    tests = {"In": lambda e: labels.get(e["key"]) in e["values"],
             "NotIn": lambda e: labels.get(e["key"]) not in e["values"],
             "Exists": lambda e: e["key"] in labels, "DoesNotExist": lambda e: e["key"] not in labels}
    return all(tests[e["operator"]](e) for e in selector.get("matchExpressions", []))


def test_each_pod_is_scraped_once(tmp_path) -> None:
    """With the disagg pools' own Services beside `inference`, a replica must still be one target:
    `sum(vllm:num_requests_waiting)` (the KEDA trigger) would otherwise count it twice."""
    for overlay in ("cpu", "disagg"):
        objects = m.build(m.compose_target(tmp_path / overlay, overlay, ["servicemonitor"]))
        monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
        services = [o for o in objects if o["kind"] == "Service"]
        for w in m.workloads(objects):
            labels = w["spec"]["template"]["metadata"]["labels"]
            targets = [(mon["metadata"]["name"], s["metadata"]["name"]) for mon in monitors for s in services
                       if selects(mon["spec"]["selector"], s["metadata"].get("labels", {}))
                       and s["spec"].get("selector") and selects({"matchLabels": s["spec"]["selector"]}, labels)]
            expected = 1 if labels["app.kubernetes.io/name"] in (*GRPC, "gateway") else 0
            assert len(targets) == expected, (overlay, w["metadata"]["name"], targets)
