"""The deploy tests' view of deploy/k8s: the base, each overlay and the reward-service
component as the real kustomize renders them (tests/kustomize_render.py), by "Kind/name";
the pod templates and Ray pods inside them; the config the RayJob's entrypoint runs and
`g2rpo plan`'s report of it; Kubernetes quantities and GPU counts. Shared by
tests/test_deploy.py, tests/test_deploy_images.py and the other deploy test files."""

import functools
import re
import shlex
from pathlib import Path

import yaml
from kustomize_render import render, render_with_components

REPO = Path(__file__).parents[1]
DEPLOY = REPO / "deploy"
GPU = "nvidia.com/gpu"
RENDERS = ["base", "cpu", "gpu"]


def _base() -> dict[str, dict]:
    return render(DEPLOY / "k8s/base")


def _rendered(name: str) -> dict[str, dict]:
    """The base or an overlay as kustomize renders it, by "Kind/name"."""
    return _base() if name == "base" else render(DEPLOY / f"k8s/overlays/{name}")


def _with_reward_service() -> dict[str, dict]:
    return render_with_components(DEPLOY / "k8s/base", DEPLOY / "k8s/components/reward-service")


def _containers(doc):
    return [c for t in _pod_templates(doc) for c in t["spec"]["containers"]]


def _pod_templates(doc) -> list[dict]:
    spec = doc.get("spec", {})
    templates = [spec.get("template")]
    for cluster in (spec, spec.get("rayClusterSpec") or {}):
        if "headGroupSpec" in cluster:
            templates.append(cluster["headGroupSpec"]["template"])
            templates += [g["template"] for g in cluster["workerGroupSpecs"]]
    templates.append(spec.get("submitterPodTemplate"))
    return [t for t in templates if t]


def _clusters(docs) -> list[tuple[str, dict]]:
    """(name, RayClusterSpec) of the RayJob and of the standing RayCluster."""
    out = []
    for key, doc in docs.items():
        if doc["kind"] == "RayJob":
            out.append((key, doc["spec"]["rayClusterSpec"]))
        elif doc["kind"] == "RayCluster":
            out.append((key, doc["spec"]))
    assert {k.split("/")[0] for k, _ in out} == {"RayJob", "RayCluster"}, out
    return out


def _ray_pods(spec: dict) -> list[tuple[str, dict, dict, int]]:
    """(where, template, rayStartParams, replicas) of the head and each worker group."""
    head = spec["headGroupSpec"]
    pods = [("head", head["template"], head["rayStartParams"], 1)]
    for g in spec["workerGroupSpecs"]:
        pods.append((g["groupName"], g["template"], g["rayStartParams"], g["replicas"]))
    return pods


def _job(docs) -> dict:
    (job,) = [d for d in docs.values() if d["kind"] == "RayJob"]
    return job


@functools.cache
def _config_of(text: str, sets: tuple[str, ...]):
    from g2rpo.common.config.loading import config_from_dict

    return config_from_dict(yaml.safe_load(text), list(sets))


def _job_config(docs) -> tuple:
    """What the RayJob's entrypoint runs: the config (the ConfigMap mounted on the head,
    or a path the image ships) with its --set overrides applied, that config's YAML text,
    the overrides, and its --redis-url."""
    job = _job(docs)
    args = shlex.split(job["spec"]["entrypoint"])
    assert args[:2] == ["g2rpo", "train"], args
    config = args[args.index("--config") + 1]
    sets = tuple(args[i + 1] for i, a in enumerate(args) if a == "--set")
    redis = args[args.index("--redis-url") + 1] if "--redis-url" in args else None
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in head["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in head["volumes"]}
    if config.startswith("/"):
        folder, name = config.rsplit("/", 1)
        source = volumes[mounts[folder]]["configMap"]["name"]
        text = docs[f"ConfigMap/{source}"]["data"][name]
    else:
        text = (REPO / config).read_text()
    return _config_of(text, sets), text, sets, redis


@functools.cache
def _plan(text: str, sets: tuple[str, ...]) -> dict:
    from g2rpo.planning.check import report

    return report(_config_of(text, sets))


def _quantity(q) -> float:
    """A Kubernetes quantity (64Gi, 500m, 8) as a number (bytes, cores)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G)?", str(q))
    assert m, q
    return float(m.group(1)) * (1e-3 if m.group(2) == "m" else units.get(m.group(2), 1))


def _gpus(template: dict) -> int:
    res = template["spec"]["containers"][0]["resources"]
    asked = {int(res.get(k, {}).get(GPU, 0)) for k in ("requests", "limits")}
    assert len(asked) == 1, f"{GPU} requests and limits differ: {res}"
    return asked.pop()
