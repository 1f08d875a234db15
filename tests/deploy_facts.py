"""What the deploy tests hold the manifests to, gathered in one place: what docs/deploy.md
installs (the operator and chart versions, their releases and namespaces, the Secrets it
tells users to create, the admin namespace) and the pods a render turns into once the
KubeRay operator and the Deployment controller have made them (tests/kuberay_model.py)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from k8s_rules import Pod
from kuberay_model import created_pods

REPO = Path(__file__).parents[1]
DOCS = REPO / "docs" / "deploy.md"


@dataclass(frozen=True)
class HelmInstall:
    release: str
    chart: str
    version: str
    namespace: str


def _commands(text: str) -> list[list[str]]:
    """The shell commands of the docs' ```bash blocks, continuation lines joined."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(shlex.split(line, comments=True))
    return out


def _flag(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def helm_installs() -> dict[str, HelmInstall]:
    """Every `helm install RELEASE CHART --version V -n NS` of the docs, by chart name."""
    installs = {}
    for argv in _commands(DOCS.read_text()):
        if argv[:2] == ["helm", "install"]:
            release, chart = argv[2], argv[3]
            installs[chart.split("/")[-1]] = HelmInstall(
                release, chart, _flag(argv, "--version") or "", _flag(argv, "-n", "--namespace")
            )
    return installs


def created_secrets() -> dict[str, set[str]]:
    """The Secrets (name -> keys) the docs' `kubectl create secret generic` commands make,
    each value from `openssl rand` (a literal in the docs would be everyone's secret)."""
    secrets: dict[str, set[str]] = {}
    text = DOCS.read_text()
    for argv in _commands(text):
        if "create" in argv and "secret" in argv and "generic" in argv:
            name = argv[argv.index("generic") + 1]
            keys = secrets.setdefault(name, set())
            for arg in argv:
                if arg.startswith("--from-literal="):
                    key, value = arg.split("=", 2)[1:]
                    assert value.startswith("$(openssl rand"), f"{name}: a literal {key} value"
                    keys.add(key)
    return secrets


def namespaces_created() -> list[str]:
    return [
        a[3] for a in _commands(DOCS.read_text()) if a[:3] == ["kubectl", "create", "namespace"]
    ]


def namespace_labels(docs: dict[str, dict], *names: str) -> dict[str, dict[str, str]]:
    """Each namespace's labels as the API server keeps them: its own (the rendered
    Namespace's) and kubernetes.io/metadata.name, which it sets on every namespace."""
    out = {n: {"kubernetes.io/metadata.name": n} for n in names}
    for doc in docs.values():
        if doc["kind"] == "Namespace":
            name = doc["metadata"]["name"]
            out[name] = {
                **(doc["metadata"].get("labels") or {}),
                "kubernetes.io/metadata.name": name,
            }
    return out


def _ports(spec: dict) -> dict[str, int]:
    return {
        p["name"]: p["containerPort"]
        for c in spec.get("containers", [])
        for p in c.get("ports") or []
        if p.get("name")
    }


def running_pods(docs: dict[str, dict]) -> list[tuple[Pod, dict]]:
    """(Pod, pod spec) of every pod the render leads to: those the KubeRay operator
    creates for the RayJob and RayCluster, one per Deployment (its template's labels)."""
    pods = []
    for obj in created_pods(docs):
        meta = obj["metadata"]
        pods.append(
            (Pod(meta["name"], meta["namespace"], meta["labels"], _ports(obj["spec"])), obj["spec"])
        )
    for doc in docs.values():
        if doc["kind"] == "Deployment":
            template = doc["spec"]["template"]
            labels = template.get("metadata", {}).get("labels") or {}
            name = f"{doc['metadata']['name']}-pod"
            namespace = doc["metadata"].get("namespace", "default")
            pods.append((Pod(name, namespace, labels, _ports(template["spec"])), template["spec"]))
    return pods
