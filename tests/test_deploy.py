"""deploy/k8s offline: every core manifest (and every pod template inside KubeRay and
Deployment objects) validates strictly against the Kubernetes 1.37 schemas; RayCluster
and RayJob carry KubeRay's required fields; the overlays' patches apply to the base;
the generated PrometheusRule is what its generator writes; docker-compose's services
point at files that exist."""

import sys
from pathlib import Path

import jsonpatch
import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).parents[1] / "deploy"
K8S_VERSION = "1.37.0"
CORE = {"v1", "apps/v1", "autoscaling/v2", "networking.k8s.io/v1"}


def _base() -> dict[str, dict]:
    kust = yaml.safe_load((DEPLOY / "k8s/base/kustomization.yaml").read_text())
    docs = {}
    for name in kust["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / "k8s/base" / name).read_text()):
            docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


def _pod(template: dict, name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": template["spec"]}


def _check_ray_cluster_spec(spec: dict, where: str) -> list[dict]:
    """KubeRay's required fields; returns the pod templates to validate as Pods."""
    head = spec["headGroupSpec"]
    assert isinstance(spec.get("rayVersion"), str), where
    assert all(isinstance(v, str) for v in head["rayStartParams"].values()), where
    pods = [_pod(head["template"], f"{where}-head")]
    assert pods[0]["spec"]["containers"][0]["image"]
    for group in spec["workerGroupSpecs"]:
        assert group["groupName"] and all(
            isinstance(v, str) for v in group["rayStartParams"].values()
        )
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group
        pods.append(_pod(group["template"], f"{where}-{group['groupName']}"))
    return pods


def _validate(docs: dict[str, dict]) -> None:
    for key, doc in docs.items():
        pods = []
        if doc["apiVersion"] in CORE:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        elif doc["kind"] == "RayCluster":
            pods = _check_ray_cluster_spec(doc["spec"], key)
        elif doc["kind"] == "RayJob":
            assert (
                isinstance(doc["spec"]["entrypoint"], str)
                and "g2rpo train" in doc["spec"]["entrypoint"]
            )
            pods = _check_ray_cluster_spec(doc["spec"]["rayClusterSpec"], key)
            pods.append(_pod(doc["spec"]["submitterPodTemplate"], f"{key}-submitter"))
        elif doc["kind"] == "PodMonitor":
            assert doc["spec"]["selector"]["matchLabels"] and doc["spec"]["podMetricsEndpoints"]
        elif doc["kind"] == "PrometheusRule":
            assert all(g["rules"] for g in doc["spec"]["groups"])
        else:
            pytest.fail(f"{key}: no check for {doc['apiVersion']}")
        for pod in pods:
            kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_base_manifests_validate():
    docs = _base()
    assert {
        "Deployment/reward-server",
        "HorizontalPodAutoscaler/reward-server",
        "RayCluster/g2rpo",
        "RayJob/g2rpo-train",
        "PrometheusRule/g2rpo",
    } <= set(docs)
    _validate(docs)
    # the HPA scales the Deployment the Service fronts, on the adapter's metric
    hpa = docs["HorizontalPodAutoscaler/reward-server"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "reward-server"
    adapter = docs["ConfigMap/prometheus-adapter-g2rpo-rules"]["data"]["config.yaml"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] in adapter
    probe = docs["Deployment/reward-server"]["spec"]["template"]["spec"]["containers"][0]
    assert probe["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probe["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_a_broken_manifest_is_caught():
    docs = _base()
    broken = yaml.safe_load(yaml.safe_dump(docs["Deployment/reward-server"]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate({"Deployment/broken": broken})


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_overlay_patches_apply_and_validate(overlay):
    kust = yaml.safe_load((DEPLOY / f"k8s/overlays/{overlay}/kustomization.yaml").read_text())
    assert kust["resources"] == ["../../base"]
    docs = _base()
    for patch in kust["patches"]:
        target = patch["target"]
        key = f"{target['kind']}/{target['name']}"
        docs[key] = jsonpatch.apply_patch(docs[key], yaml.safe_load(patch["patch"]))
    _validate(docs)
    images = {i["name"] for i in kust["images"]}
    used = {
        c["image"].split(":")[0]
        for d in docs.values()
        for c in _containers(d)
        if c["image"].startswith("ghcr.io/g2rpo/")
    }
    assert used == images


def _containers(doc):
    spec = doc.get("spec", {})
    templates = [spec.get("template")]
    for cluster in (spec, spec.get("rayClusterSpec") or {}):
        if "headGroupSpec" in cluster:
            templates.append(cluster["headGroupSpec"]["template"])
            templates += [g["template"] for g in cluster["workerGroupSpecs"]]
    templates.append(spec.get("submitterPodTemplate"))
    return [c for t in templates if t for c in t["spec"]["containers"]]


def test_prometheus_rule_is_generated_from_the_rule_files():
    sys.path.insert(0, str(DEPLOY / "k8s"))
    try:
        import prometheus_rule
    finally:
        sys.path.pop(0)
    committed = (DEPLOY / "k8s/base/prometheus-rules.yaml").read_text()
    assert committed == prometheus_rule.prometheus_rule(), (
        "regenerate: .venv/bin/python deploy/k8s/prometheus_rule.py "
        "> deploy/k8s/base/prometheus-rules.yaml"
    )


def test_compose_and_dockerfiles_point_at_what_exists():
    compose_dir = DEPLOY / "compose"
    compose = yaml.safe_load((compose_dir / "docker-compose.yaml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (compose_dir / source).exists(), f"{name}: {source}"
    assert {"redis", "reward-1", "reward-2", "prometheus", "grafana"} == set(compose["services"])
    root = DEPLOY.parent
    for dockerfile in (DEPLOY / "docker").glob("Dockerfile*"):
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                for src in line.split()[1:-1]:
                    assert (root / src).exists(), f"{dockerfile.name}: COPY {src}"
        assert "USER " in dockerfile.read_text()  # never root at run time


def _copied_into_src(dockerfile: Path) -> set[str]:
    sources = set()
    for line in dockerfile.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and "--from=" not in line and parts[-1].startswith("/src"):
            sources.update(parts[1:-1])
    return sources


def test_the_images_carry_what_their_commands_need():
    """Both images `pip install /src`: each copies every folder pyproject's package-dir
    installs, the package data among them (the committed world, the configs), so that
    docker-compose's reward servers find shapes_clip's default model and the CPU
    overlay's `--config configs/tiny.yaml` resolves (tests/test_packaging.py installs a
    wheel built from that set and runs from it)."""
    import re

    import tomllib
    from g2rpo.common.paths import DEFAULT_WORLD, PROJECT_ROOT

    tool = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {target.split("/")[0] for target in tool["package-dir"].values()}
    assert {"assets", "configs"} <= folders
    for name in ("Dockerfile", "Dockerfile.reward"):
        copied = _copied_into_src(DEPLOY / "docker" / name)
        assert folders | {"pyproject.toml", "README.md"} <= copied, f"{name} lacks some"

    # the scorers the compose replicas and the CPU overlay serve from their default dirs
    compose = yaml.safe_load((DEPLOY / "compose/docker-compose.yaml").read_text())
    texts = [" ".join(s["command"]) for n, s in compose["services"].items() if "reward" in n]
    texts.append((DEPLOY / "k8s/overlays/cpu/kustomization.yaml").read_text())
    served = {
        name
        for text in texts
        for value in re.findall(r"--scorers[= ]([\w,=./-]+)", text)
        for name in value.split(",")
        if "=" not in name
    }
    assert "shapes_clip" in served
    world = DEFAULT_WORLD.relative_to(PROJECT_ROOT)
    assert world.parts[0] in folders  # shapes_clip's default, DEFAULT_WORLD/shapes_clip
    assert (DEFAULT_WORLD / "shapes_clip" / "model.safetensors").is_file()


def test_the_reward_server_imports_only_its_image_requirements():
    """Dockerfile.reward installs the project with --no-deps plus reward-requirements.txt:
    serving every scorer kind must not need the project's other dependencies. transformers
    imports some of them (jinja2, scipy, accelerate) only when they are installed; g2rpo's
    own modules must import none."""
    import re
    import subprocess

    import tomllib

    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[<>=\[ ;]", r.strip(), maxsplit=1)[0].lower() for r in reqs if r.strip()}

    wanted = (DEPLOY / "docker/reward-requirements.txt").read_text().splitlines()
    allowed = names(r for r in wanted if not r.startswith("#")) | {"torch"}
    excluded = names(project["dependencies"]) - allowed
    assert {"ray", "diffusers", "peft", "matplotlib"} <= excluded
    code = (
        "from g2rpo.cli import build_parser\n"
        "from g2rpo.reward_server.app import create_app\n"
        "from g2rpo.reward_server.settings import ServerSettings, ScorerSpec\n"
        "from g2rpo.reward_server.scorers import clip_score, image_reward, shapes_oracle, jpeg\n"
        "from g2rpo.reward_server.convert import convert_reward\n"
        "create_app(ServerSettings(scorers=[ScorerSpec(name='shapes_oracle')]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stderr.splitlines()
    # the import tree, parents after children: walk it keeping each line's parent
    parents: dict[int, str] = {}
    importers: dict[str, str] = {}
    for line in reversed(lines):
        if not line.startswith("import time:") or "imported package" in line:
            continue
        field = line.split("|")[2]
        depth = (len(field) - len(field.lstrip())) // 2
        name = field.strip()
        parents[depth] = name
        top = name.split(".")[0].replace("_", "-").lower()
        if top in excluded and depth > 0:
            importers.setdefault(top, parents[depth - 1])
    ours = {pkg: by for pkg, by in importers.items() if by.startswith("g2rpo")}
    assert not ours, f"g2rpo modules import packages the reward image lacks: {ours}"
    assert importers.keys() <= {"jinja2", "scipy", "accelerate"}, importers
