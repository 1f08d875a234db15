"""deploy/k8s as the systems that run it take it (issue 55, "deploy as the operator takes
it"): each overlay, rendered by kustomize, is handed to models of the KubeRay operator
(tests/kuberay_model.py, ray-project/kuberay v1.7.0), of Kubernetes' own validation and
scheduling (tests/k8s_rules.py) and of kube-prometheus-stack's selection
(tests/kps_model.py, chart 88.5.3), each written from those projects' source. Every test
here failed on 3bb9114's manifests, and says what it caught. The NetworkPolicies and the
Secrets: tests/test_deploy_access.py."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import tomllib
import yaml
from deploy_facts import DOCS, REPO, helm_installs, namespace_labels, running_pods
from deploy_render import DEPLOY, RENDERS, _job, _job_config, _rendered
from k8s_rules import container_port_errors, forced_onto_one_node, selects, service_errors
from kps_model import KPS_CHART_VERSION, picked_up, prometheus_spec
from kuberay_model import (
    JOB_CLUSTER,
    KUBERAY_VERSION,
    attempts,
    cluster_pods,
    commands_run,
    created_pods,
    head_services,
    health_probes,
)
from test_deploy import K8S_VERSION

OVERLAYS = sorted(p.name for p in (DEPLOY / "k8s/overlays").iterdir() if p.is_dir())
IMAGE = "ghcr.io/g2rpo/g2rpo"  # built from deploy/docker/Dockerfile


# ------------------------------------------------- 1. the head Service Kubernetes accepts


@pytest.mark.parametrize("render", RENDERS)
def test_the_operator_builds_services_and_pods_kubernetes_accepts(render):
    """Catches 3bb9114's head container port `ray-metrics: 8080`: getServicePorts added
    `metrics: 8080` beside it, Kubernetes refused the head Service as a duplicate (TCP,
    8080), and the operator, which builds the Service before any pod, created none. Also
    that each head Service selects its head pod: the RayJob's own <job>-head-svc selects
    app.kubernetes.io/name `kuberay`, which 3bb9114's head template replaced."""
    docs = _rendered(render)
    pods = created_pods(docs)
    problems = []
    services = head_services(docs)
    assert len(services) == 3, [s["metadata"]["name"] for s in services]
    for svc in services:
        name = svc["metadata"]["name"]
        problems += [f"Service {name}: {e}" for e in service_errors(svc)]
        kubernetes_validate.validate(svc, K8S_VERSION, strict=True)
        heads = [
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["namespace"] == svc["metadata"]["namespace"]
            and svc["spec"]["selector"].items() <= p["metadata"]["labels"].items()
        ]
        if len(heads) != 1 or not heads[0].endswith("-head"):
            problems.append(f"Service {name} selects {heads}, not one head pod")
    checked = set()
    for pod in pods:
        labels = pod["metadata"]["labels"]
        group = (labels.get("ray.io/cluster", pod["metadata"]["name"]), labels.get("ray.io/group"))
        if group in checked:
            continue  # the replicas of a group are alike
        checked.add(group)
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            problems += [f"Pod {pod['metadata']['name']}: {e}" for e in container_port_errors(c)]
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert not problems, "\n".join(problems)


# ---------------------------------------------- 2. one Ray version; probes the image runs


def _constraint(name: str) -> str | None:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        m = re.match(rf"^{name}==(\S+)", line.strip())
        if m:
            return m.group(1)
    return None


def test_one_ray_version_everywhere():
    """Catches 3bb9114: rayVersion "2.52.0" while the image installed whatever Ray
    resolved (the venv 2.60.0): the operator chose probes for a Ray the pods did not run.
    Now constraints.txt pins Ray, the venv runs it, every rayVersion says it, and the
    image installs the project under those constraints (torch left to its TORCH arg)."""
    pin = _constraint("ray")
    assert pin, "constraints.txt pins no ray=="
    assert pin == importlib.metadata.version("ray"), "the venv's Ray is not constraints.txt's"
    for render in RENDERS:
        for doc in _rendered(render).values():
            if doc["kind"] in ("RayJob", "RayCluster"):
                spec = doc["spec"].get("rayClusterSpec", doc["spec"])
                assert spec["rayVersion"] == pin, (render, doc["metadata"]["name"])
    build = _stages(DEPLOY / "docker/Dockerfile")[0]
    assert any(line.startswith("COPY constraints.txt ") for line in build), "no constraints"
    (install,) = [line for line in build if "pip install" in line and "/src" in line]
    grep = re.search(r"grep -v '([^']+)' \S*constraints.txt > (\S+)", install)
    assert grep and f"-c {grep.group(2)}" in install, install
    kept = [
        ln
        for ln in (REPO / "constraints.txt").read_text().splitlines()
        if not re.search(grep.group(1), ln)
    ]
    assert any(ln.startswith(f"ray=={pin}") for ln in kept)
    assert not any(ln.startswith("torch") for ln in kept), "torch comes from TORCH"


def _stages(dockerfile: Path) -> list[list[str]]:
    """The Dockerfile's stages, each a list of instructions (continuations joined); the
    lines before the first FROM as stage -1's ARGs are returned in the first's."""
    text = dockerfile.read_text().replace("\\\n", " ")
    stages: list[list[str]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if (
            line.startswith("FROM ")
            and stages[-1]
            and any(x.startswith("FROM ") for x in stages[-1])
        ):
            stages.append([])
        stages[-1].append(line)
    return stages


# what an Ubuntu base image holds (its Essential packages: bash, coreutils, grep, sed, ...)
UBUNTU_BASE = {"bash", "/bin/bash", "sh", "grep", "sed", "sleep", "cat", "env", "ls", "rm", "id"}
APT_COMMANDS = {
    "python3": {"python3"},
    "wget": {"wget"},
    "curl": {"curl"},
    "ca-certificates": set(),
}


def image_commands(dockerfile: Path) -> set[str]:
    """The commands on the final stage's PATH: the Ubuntu base's, the apt packages it
    installs, and the venv it copies from the build stage (/opt/g2rpo/bin: python, pip,
    and the console scripts of the project and of its direct dependencies, Ray's `ray`
    among them, at the versions this venv runs: constraints.txt's)."""
    stages = _stages(dockerfile)
    final, build = stages[-1], stages[0]
    (base,) = re.findall(r"^ARG BASE=(\S+)", "\n".join(build), re.M)
    assert "ubuntu" in base and final[0] == "FROM ${BASE}", (base, final[0])
    found = set(UBUNTU_BASE)
    for line in final:
        m = re.search(r"apt-get install (.*?)(&&|$)", line)
        for pkg in m.group(1).split() if m else []:
            if not pkg.startswith("-"):
                found |= APT_COMMANDS[pkg]  # a KeyError: say what the package installs
    venv = "/opt/g2rpo"
    assert any(f"python3 -m venv {venv}" in line for line in build)
    assert f"COPY --from=build {venv} {venv}" in final
    assert any(line.startswith("ENV PATH=") and f"{venv}/bin" in line for line in final)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found |= {"python", "python3", "pip", *project.get("scripts", {})}
    for requirement in project["dependencies"]:
        name = re.split(r"[<>=\[ ;]", requirement, maxsplit=1)[0]
        scripts = importlib.metadata.distribution(name).entry_points.select(group="console_scripts")
        found |= {s.name for s in scripts}
    return found


@pytest.mark.parametrize("render", RENDERS)
def test_the_image_has_what_the_operator_runs_in_it(render):
    """Catches 3bb9114: for rayVersion 2.52.0 (below 2.53) KubeRay v1.7.0 injects exec
    probes `bash -c "wget ... | grep success"`, and the image had no wget: no Ray pod ever
    turned Ready. Checks every command the operator runs in our image (`ray start`, the
    wait-gcs-ready init container, the submitter's `python -c` and `ray job`, each probe)
    against what the Dockerfile's final stage holds; and the exec probes too, which
    operators before v1.6 send whatever the Ray version, so those still find wget."""
    have = image_commands(DEPLOY / "docker/Dockerfile")
    problems = []
    for pod in created_pods(_rendered(render)):
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            if not c["image"].startswith(IMAGE + ":"):
                continue
            argvs = [c.get("command", []) + c.get("args", [])]
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if "exec" in c.get(probe, {}):
                    argvs.append(c[probe]["exec"]["command"])
            for argv in argvs:
                for missing in sorted(commands_run(argv) - have):
                    problems.append(f"{pod['metadata']['name']} {c['name']}: no {missing}")
    for node_type in ("head", "worker"):
        probe = health_probes(node_type, "2.52.0", {})["readinessProbe"]["exec"]["command"]
        for missing in sorted(commands_run(probe) - have):
            problems.append(f"an exec probe (operators before v1.6): no {missing}")
    assert not problems, "\n".join(sorted(set(problems)))


# ---------------------------------------------------------------- 3. the run claim binds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_run_claim_binds_and_its_pods_can_mount_it(overlay):
    """Catches 3bb9114's g2rpo-runs: ReadWriteMany and no storageClassName, so it bound
    only where the default class is RWX (usually RWO: Pending forever). Now a RWX claim
    names its class (the GPU overlay); a RWO one (the CPU overlay, on the default class)
    is mounted only by pods the scheduler must put on one node: RWO lets the pods of one
    node share it."""
    docs = _rendered(overlay)
    pods = running_pods(docs)
    problems = []
    for doc in docs.values():
        if doc["kind"] != "PersistentVolumeClaim":
            continue
        name, modes = doc["metadata"]["name"], set(doc["spec"]["accessModes"])
        users = [
            (pod, spec)
            for pod, spec in pods
            if any(
                v.get("persistentVolumeClaim", {}).get("claimName") == name
                for v in spec.get("volumes", [])
            )
        ]
        if "ReadWriteMany" in modes and not doc["spec"].get("storageClassName"):
            problems.append(f"{name}: ReadWriteMany on the default class, usually RWO")
        elif modes == {"ReadWriteOnce"} and len(users) > 1:
            problems += forced_onto_one_node(users, [p for p, _ in pods])
        elif "ReadWriteOncePod" in modes and len(users) > 1:
            problems.append(f"{name}: ReadWriteOncePod, mounted by {len(users)} pods")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------ 4. a retry resumes the run


@pytest.mark.parametrize("render", RENDERS)
def test_a_retried_job_resumes_its_run(render):
    """Catches 3bb9114's RayJob: backoffLimit 0 (no retry) and an entrypoint that started
    a new run, refusing the existing run directory on a re-apply. Now the entrypoint, as
    the real `g2rpo` parser takes it, resumes or starts (--resume-or-start with --config),
    and the operator tries it more than once (v1.7.0: backoffLimit + 1 attempts), each
    attempt a new RayCluster from rayClusterSpec whose pods mount the same claim at
    run.output_dir, where the last attempt's checkpoints are."""
    from g2rpo.cli import build_parser

    docs = _rendered(render)
    job = _job(docs)
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[0] == "g2rpo", argv
    args = build_parser().parse_args(argv[1:])  # argparse exits on what it refuses
    assert args.command == "train" and args.config, argv
    assert args.resume_or_start, "a retry would start the run again: --resume-or-start"
    tries = attempts(job["spec"].get("backoffLimit"))
    assert tries >= 2, f"backoffLimit {job['spec'].get('backoffLimit')}: no retry"
    cfg, *_ = _job_config(docs)
    claims = set()
    for attempt in range(tries):
        cluster = JOB_CLUSTER.format(job=f"attempt{attempt}")
        for pod in cluster_pods(cluster, "g2rpo", job["spec"]["rayClusterSpec"]):
            spec = pod["spec"]
            (mount,) = [
                m
                for m in spec["containers"][0]["volumeMounts"]
                if m["mountPath"] == cfg.run.output_dir
            ]
            (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
            claims.add(volume.get("persistentVolumeClaim", {}).get("claimName"))
    assert len(claims) == 1 and f"PersistentVolumeClaim/{claims.pop()}" in docs, claims


# -------------------------------------------------- 5. kube-prometheus-stack selects them


def test_the_kps_model_follows_the_chart_template():
    """The model's selectors on known cases: the chart's defaults select by `release`;
    with *NilUsesHelmValues off the selectors are {} (everything)."""
    spec = prometheus_spec("kps")
    assert spec["podMonitorSelector"] == {"matchLabels": {"release": "kps"}}
    assert spec["ruleSelector"] == {"matchLabels": {"release": "kps"}}
    assert spec["podMonitorNamespaceSelector"] == spec["ruleNamespaceSelector"] == {}
    ns = {"a": {"kubernetes.io/metadata.name": "a"}}
    pm = {"kind": "PodMonitor", "metadata": {"namespace": "a", "labels": {"release": "kps"}}}
    assert picked_up(pm, spec, "monitoring", ns)
    assert not picked_up({**pm, "metadata": {"namespace": "a"}}, spec, "monitoring", ns)
    off = prometheus_spec("kps", {"podMonitorSelectorNilUsesHelmValues": False})
    assert off["podMonitorSelector"] == {} and "ruleSelector" not in off
    assert picked_up({**pm, "metadata": {"namespace": "a"}}, off, "monitoring", ns)
    nil_ns = {**spec, "podMonitorNamespaceSelector": None}
    assert not picked_up(pm, nil_ns, "monitoring", ns)  # null: the Prometheus' namespace only


@pytest.mark.parametrize("render", RENDERS)
def test_kube_prometheus_stack_picks_up_every_monitoring_object(render):
    """Catches 3bb9114's PodMonitors and PrometheusRule: no `release` label, which the
    chart's Prometheus selects on by default, so monitoring stayed empty and no alert
    fired. Each is now picked up by the release docs/deploy.md installs, in an admitted
    namespace; each PodMonitor selects pods (the Ray heads' as KubeRay labels them)
    whose containers name every endpoint port it scrapes."""
    kps = helm_installs()["kube-prometheus-stack"]
    prometheus = prometheus_spec(kps.release)
    docs = _rendered(render)
    spaces = namespace_labels(docs, kps.namespace)
    monitoring = [d for d in docs.values() if d["kind"] in ("PodMonitor", "PrometheusRule")]
    assert {d["kind"] for d in monitoring} == {"PodMonitor", "PrometheusRule"}
    problems = [
        f"{d['kind']} {d['metadata']['name']}: not picked up by release {kps.release}"
        for d in monitoring
        if not picked_up(d, prometheus, kps.namespace, spaces)
    ]
    pods = running_pods(docs)
    for monitor in (d for d in monitoring if d["kind"] == "PodMonitor"):
        where = monitor["metadata"]["namespace"]  # spec.namespaceSelector unset: its own
        targets = [
            p
            for p, _ in pods
            if p.namespace == where and selects(monitor["spec"]["selector"], p.labels)
        ]
        if monitor["metadata"]["name"] == "g2rpo-train" and not targets:
            problems.append("PodMonitor g2rpo-train selects no Ray head")
        for pod in targets:
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                if endpoint["port"] not in pod.ports:
                    problems.append(
                        f"{monitor['metadata']['name']}: {pod.name} has no port {endpoint['port']}"
                    )
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------- 9. the docs say so


def test_the_docs_install_what_the_models_were_read_from():
    """docs/deploy.md pins the KubeRay operator and kube-prometheus-stack the models
    follow, names the storage class to set and how a retry resumes (3bb9114 pinned
    operator 1.4.2 and no chart version, and said neither)."""
    installs = helm_installs()
    assert installs["kuberay-operator"].version == KUBERAY_VERSION
    assert installs["kube-prometheus-stack"].version == KPS_CHART_VERSION
    kust = yaml.safe_load((DEPLOY / "k8s/base/monitoring/kustomization.yaml").read_text())
    (labels,) = [entry["pairs"] for entry in kust["labels"]]
    assert labels == {"release": installs["kube-prometheus-stack"].release}
    text = DOCS.read_text()
    for phrase in ("kubectl get storageclass", "--resume-or-start", "backoffLimit"):
        assert phrase in text, phrase
