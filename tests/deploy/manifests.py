"""Reading deploy/k8s/: the base's files as they are, and any kustomization built with `kubectl kustomize`.

`base_objects()` parses the base's YAML files directly (no kubectl needed: the base transforms nothing
but labels and image tags); `build(target)` runs `kubectl kustomize` on an overlay, or on a throwaway
kustomization that adds components to one (`compose_target`). `container(objects, kind, name)` finds a
workload's main container; `argv(container)` is its command and args together.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
OVERLAYS = ("cpu", "gpu", "gpu-vllm", "milvus", "disagg", "tls")
COMPONENTS = ("tls", "gpu", "vllm", "keda", "inference-hpa", "servicemonitor", "prometheus-annotations")
WORKLOADS = ("Deployment", "StatefulSet")


def find_kubectl() -> tuple[str | None, str]:
    """kubectl with kustomize 5 or later (components, labels), or None and why not."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None, "kubectl is not installed: the overlays cannot be built"
    try:
        version = json.loads(subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True,
                                            text=True, timeout=60).stdout).get("kustomizeVersion", "")
    except (ValueError, OSError, subprocess.SubprocessError):
        version = ""
    major = re.match(r"v(\d+)\.", version)
    if major is None or int(major.group(1)) < 5:
        return None, f"{kubectl} has kustomize {version or 'of unknown version'}: the overlays need 5 or later"
    return kubectl, ""


KUBECTL, NO_KUBECTL = find_kubectl()


def base_objects() -> list[dict]:
    """Every object of the base, from its files (kustomization.yaml files excluded)."""
    objects = []
    for path in sorted(BASE.rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            objects.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return objects


def build(target: Path) -> list[dict]:
    """`kubectl kustomize target`, parsed."""
    result = subprocess.run([KUBECTL, "kustomize", str(target)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {target} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def compose_target(directory: Path, overlay: str, components: list[str]) -> Path:
    """A kustomization in `directory` of `overlay` plus `components` (names under components/, or
    `grafana`). Kustomize takes relative paths only."""
    directory.mkdir(parents=True, exist_ok=True)
    up = Path(os.path.relpath(K8S, directory))
    paths = [str(up / ("grafana" if name == "grafana" else f"components/{name}")) for name in components]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(up / "overlays" / overlay)], "components": paths}))
    return directory


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def workloads(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in WORKLOADS]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def container(objects: list[dict], kind: str, name: str) -> dict:
    """The workload's container named like it (each streamrag pod runs one)."""
    containers = pod_spec(find(objects, kind, name))["containers"]
    return next(c for c in containers if c["name"] == name or len(containers) == 1)


def argv(c: dict) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


def env_names(c: dict) -> set[str]:
    return {e["name"] for e in c.get("env", [])}


def port(c: dict, name: str) -> int | None:
    return next((p["containerPort"] for p in c.get("ports", []) if p["name"] == name), None)


def flags(args: list[str]) -> dict[str, list[str]]:
    """`--flag value ...` grouped: each flag's values in order (a repeated flag's all together)."""
    grouped: dict[str, list[str]] = {}
    current = None
    for word in args:
        if word.startswith("--"):
            current = word
            grouped.setdefault(current, [])
        else:
            assert current is not None, f"a value before any flag: {args}"
            grouped[current].append(word)
    return grouped
