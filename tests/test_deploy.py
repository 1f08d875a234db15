"""deploy/k8s offline, as the real kustomize renders it (kubectl's, tests/kustomize_render.py):
every core manifest (and every pod template inside KubeRay and Deployment objects)
validates strictly against the Kubernetes 1.37 schemas; RayCluster and RayJob carry
KubeRay's required fields; the overlays' patches and components apply to the base; the
generated PrometheusRule is what its generator writes. (docker-compose and the images:
tests/test_deploy_images.py.)

And the KubeRay manifests, as each overlay renders them, can run the config their job
names: the ConfigMap is a shipped recipe plus the stated deploy overrides and `g2rpo plan`
passes it; the worker pods hold the recipe's `# hardware:` GPUs with one pod holding the
whole learner group (its STRICT_PACK placement group); every Ray pod mounts the run
directory (one claim at run.output_dir); /dev/shm holds the object store. What the
operator, Kubernetes and kube-prometheus-stack make of them: tests/test_operator_conformance.py."""

import json
import math
import re
import sys

import kubernetes_validate
import pytest
import yaml
from deploy_render import (
    DEPLOY,
    GPU,
    RENDERS,
    REPO,
    _base,
    _clusters,
    _containers,
    _gpus,
    _job_config,
    _plan,
    _pod_templates,
    _quantity,
    _ray_pods,
    _rendered,
    _with_reward_service,
)

K8S_VERSION = "1.37.0"
CORE = {"v1", "apps/v1", "autoscaling/v2", "networking.k8s.io/v1"}
HARDWARE = re.compile(r"^# hardware: (\d+) x (\d+(?:\.\d+)?)GiB GPUs$", re.M)
RECIPE = re.compile(r"^# recipe: (\S+)$", re.M)
# What the ConfigMap may change in the recipe it holds, and nothing else (`# deploy:` there)
DEPLOY_OVERRIDES = {
    "run.output_dir": "/runs",  # the g2rpo-runs claim, mounted on every Ray pod
    "train.metrics.port": 9400,  # the driver's exporter, PodMonitor g2rpo-train
    "train.metrics.host": "0.0.0.0",
    "train.env_vars": {"NCCL_DEBUG": "WARN"},  # every actor's environment
    "train.reward.resources": {"reward": 1},  # the job's reward replicas: the gpu1 pod
    "train.reward.token_env": "G2RPO_REWARD_TOKEN",  # the reward-token Secret
    "train.reward.redis_password_env": "G2RPO_REDIS_PASSWORD",  # the redis-password Secret
}


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
        "RayCluster/g2rpo",
        "RayJob/g2rpo-train",
        "ConfigMap/train-config",
        "PersistentVolumeClaim/g2rpo-runs",
        "PrometheusRule/g2rpo",
    } <= set(docs)
    _validate(docs)


def test_the_reward_service_component_validates():
    docs = _with_reward_service()
    assert {"Deployment/reward-server", "HorizontalPodAutoscaler/reward-server"} <= set(docs)
    _validate(docs)
    # the HPA scales the Deployment the Service fronts, on the adapter's metric
    hpa = docs["HorizontalPodAutoscaler/reward-server"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "reward-server"
    adapter = docs["ConfigMap/prometheus-adapter-g2rpo-rules"]["data"]["config.yaml"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] in adapter
    probe = docs["Deployment/reward-server"]["spec"]["template"]["spec"]["containers"][0]
    assert probe["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probe["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # --device=cuda: the replica holds a GPU
    assert "--device=cuda" in probe["args"] and probe["resources"]["limits"][GPU] == "1"


def test_a_broken_manifest_is_caught():
    docs = _with_reward_service()
    broken = yaml.safe_load(yaml.safe_dump(docs["Deployment/reward-server"]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate({"Deployment/broken": broken})


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_overlay_patches_apply_and_validate(overlay):
    kust = yaml.safe_load((DEPLOY / f"k8s/overlays/{overlay}/kustomization.yaml").read_text())
    assert kust["resources"] == ["../../base"]
    docs = _rendered(overlay)
    _validate(docs)
    images = {i["name"] for i in kust["images"]}
    used = {
        c["image"].split(":")[0]
        for d in docs.values()
        for c in _containers(d)
        if c["image"].startswith("ghcr.io/g2rpo/")
    }
    # every image the overlay runs is pinned by it; the others it pins are the
    # reward-service component's, which the overlay's comment says how to add
    offered = used | {
        c["image"].split(":")[0] for d in _with_reward_service().values() for c in _containers(d)
    }
    assert "ghcr.io/g2rpo/g2rpo" in used and used <= images <= offered


# --------------------------------------------------------------------- the Ray pods


@pytest.mark.parametrize("render", RENDERS)
def test_every_ray_pod_mounts_the_run_directory(render):
    """run.output_dir is one filesystem at one absolute path for the driver (the head)
    and every pod that can host a learner rank or rollout worker (every worker group):
    the same claim, writable (fsGroup: the pods run as uid 1000), there; ReadWriteMany, or
    ReadWriteOnce with the pods held to one node (test_operator_conformance checks how)."""
    docs = _rendered(render)
    cfg, *_ = _job_config(docs)
    out = cfg.run.output_dir
    assert out.startswith("/"), f"run.output_dir {out!r}: relative to each raylet's cwd"
    claims, problems = set(), []
    for key, spec in _clusters(docs):
        for where, template, _, _ in _ray_pods(spec):
            pod = template["spec"]
            mounts = pod["containers"][0].get("volumeMounts", [])
            mount = next((m for m in mounts if m["mountPath"] == out), None)
            if mount is None:
                problems.append(f"{key} {where}: nothing mounted at run.output_dir {out}")
                continue
            (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
            if mount.get("readOnly") or "persistentVolumeClaim" not in volume:
                problems.append(f"{key} {where}: {out} is {volume}, read-only {mount}")
                continue
            claims.add(volume["persistentVolumeClaim"]["claimName"])
            if not pod.get("securityContext", {}).get("fsGroup"):
                problems.append(f"{key} {where}: no fsGroup, {out} may not be writable")
    assert not problems, "\n".join(problems)
    assert len(claims) == 1, f"{out} is several claims: {claims}"
    claim = claims.pop()
    assert f"PersistentVolumeClaim/{claim}" in docs, f"{claim}: no claim in the manifests"
    pvc = docs[f"PersistentVolumeClaim/{claim}"]["spec"]
    assert {"ReadWriteMany", "ReadWriteOnce"} & set(pvc["accessModes"]), pvc


@pytest.mark.parametrize("render", RENDERS)
def test_every_ray_pod_mounts_what_the_config_reads(render):
    """The model, the prompt files and the job's reward scorers are absolute paths that
    every Ray pod (any of them may host a worker, a learner rank, the evaluator or a
    reward replica; the head's driver reads them too) mounts read-only."""
    docs = _rendered(render)
    cfg, *_ = _job_config(docs)
    t = cfg.train
    paths = [cfg.model.pretrained, t.prompts, t.eval.prompts]
    paths += [s.split("=", 1)[1] for s in t.reward.scorers if "=" in s]
    paths = [p for p in paths if p and p.startswith("/")]
    problems = []
    for key, spec in _clusters(docs):
        for where, template, _, _ in _ray_pods(spec):
            mounts = template["spec"]["containers"][0].get("volumeMounts", [])
            for path in paths:
                under = [m for m in mounts if path.startswith(m["mountPath"].rstrip("/") + "/")]
                if not under or not all(m.get("readOnly") for m in under):
                    problems.append(f"{key} {where}: {path} not mounted read-only")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("render", RENDERS)
def test_the_pods_hold_what_the_job_asks_ray(render):
    """GPU configs: the RayJob's worker pods (replicas x per pod) hold exactly the GPUs
    of the recipe's `# hardware:` header, the head none, and one pod holds the whole
    learner group (its STRICT_PACK placement group). CPU configs: no GPU asked anywhere.
    Either way every custom resource the config's actors ask for is offered by the worker
    groups, and `g2rpo plan` passes the config. The standing RayCluster likewise."""
    docs = _rendered(render)
    cfg, text, sets, redis = _job_config(docs)
    t = cfg.train
    problems = [] if _plan(text, sets)["fits"] else ["g2rpo plan: some actor does not fit"]
    header = None
    if cfg.model.device.startswith("cuda"):
        recipes = RECIPE.findall(text)
        if len(recipes) != 1:
            problems.append("the config names no `# recipe:` whose `# hardware:` to hold")
        else:
            (header,) = HARDWARE.findall((REPO / recipes[0]).read_text())
            if HARDWARE.findall(text) != [header]:
                problems.append(f"the config's `# hardware:` line is not {recipes[0]}'s")
    elif GPU in json.dumps(docs):
        problems.append("a CPU config, and a GPU asked somewhere")
    for key, spec in _clusters(docs):
        pods = _ray_pods(spec)
        if pods[0][2].get("num-gpus") != "0" or _gpus(pods[0][1]):
            problems.append(f"{key}: the head (the driver) holds GPUs")
        workers = pods[1:]
        if cfg.model.device.startswith("cuda"):
            total = sum(replicas * _gpus(tpl) for _, tpl, _, replicas in workers)
            if header is not None and total != int(header[0]):
                problems.append(f"{key}: worker pods hold {total} GPUs, the header {header[0]}")
            per_rank = math.ceil(t.learner.num_gpus) if t.learner.count > 1 else 0
            biggest = max(_gpus(tpl) for _, tpl, _, _ in workers)
            if biggest < t.learner.count * per_rank:
                problems.append(
                    f"{key}: the biggest pod holds {biggest} GPUs, the {t.learner.count} "
                    f"learner ranks need one node (train.learner.placement_strategy "
                    f"{t.learner.placement_strategy})"
                )
        else:
            cpus = max(
                _quantity(tpl["spec"]["containers"][0]["resources"]["requests"]["cpu"])
                for _, tpl, _, _ in pods
            )
            if cpus < t.learner.count * t.learner.num_cpus:
                problems.append(f"{key}: no pod holds the learner group's CPUs")
        offered: dict[str, float] = {}
        for _, _, params, replicas in workers:
            if "resources" in params:
                for name, amount in json.loads(json.loads(params["resources"])).items():
                    offered[name] = offered.get(name, 0) + amount * replicas
        kinds = [(t.workers, t.workers.count), (t.learner, t.learner.count)]
        kinds += [(t.reward, t.reward.job_replicas(redis)), (t.eval, int(t.eval.on_actor))]
        for kind, count in kinds:
            for name, amount in kind.resources.items():
                offered[name] = offered.get(name, 0) - amount * count
                if offered[name] < 0:
                    problems.append(f"{key}: custom resource {name} short by {-offered[name]}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("render", RENDERS)
def test_dev_shm_holds_the_object_store_and_memory_the_pipelines(render):
    """Every Ray pod sets object-store-memory (a string, as all rayStartParams) and
    mounts /dev/shm as a memory emptyDir at least that big (a pod's default is 64 MB, and
    a full fine-tune puts a 23.8 GB weight version there every iteration). Its memory
    limit holds that tmpfs (counted against the pod) plus, per GPU, a rollout worker's
    weights passing through host memory as it loads them (the plan's weight parts)."""
    docs = _rendered(render)
    _, text, sets, _ = _job_config(docs)
    plan = _plan(text, sets)
    (worker,) = [a for a in plan["actors"] if a["actor"] == "rollout worker"]
    weights = sum(v for k, v in worker["parts_gib"].items() if "weights" in k) * 2**30
    problems = []
    for key, spec in _clusters(docs):
        for where, template, params, _ in _ray_pods(spec):
            assert all(isinstance(v, str) for v in params.values()), f"{key} {where}"
            pod = template["spec"]
            container = pod["containers"][0]
            mounts = container.get("volumeMounts", [])
            mount = next((m for m in mounts if m["mountPath"] == "/dev/shm"), None)
            (volume,) = [v for v in pod["volumes"] if mount and v["name"] == mount["name"]] or [{}]
            shm = volume.get("emptyDir", {})
            if "object-store-memory" not in params:
                problems.append(f"{key} {where}: no object-store-memory")
            if shm.get("medium") != "Memory" or "sizeLimit" not in shm:
                problems.append(f"{key} {where}: /dev/shm is not a sized memory emptyDir")
                continue
            if _quantity(shm["sizeLimit"]) < int(params.get("object-store-memory", 0)):
                problems.append(f"{key} {where}: /dev/shm smaller than the object store")
            limit = _quantity(container["resources"]["limits"]["memory"])
            need = _quantity(shm["sizeLimit"]) + _gpus(template) * weights
            if limit < need:
                problems.append(
                    f"{key} {where}: memory limit {limit / 2**30:.0f} GiB under /dev/shm + "
                    f"{_gpus(template)} x {weights / 2**30:.1f} GiB of pipeline = "
                    f"{need / 2**30:.0f} GiB"
                )
    assert not problems, "\n".join(problems)


def test_the_config_map_is_the_recipe_with_the_deploy_overrides():
    """The ConfigMap's train.yaml is the recipe its `# recipe:` line names with exactly
    DEPLOY_OVERRIDES applied: every other field equal (flux_hps, as shipped)."""
    text = _base()["ConfigMap/train-config"]["data"]["train.yaml"]
    recipes = RECIPE.findall(text)
    assert len(recipes) == 1, "train.yaml names no `# recipe: configs/....yaml`"
    recipe = recipes[0]
    expected = yaml.safe_load((REPO / recipe).read_text())
    for dotted, value in DEPLOY_OVERRIDES.items():
        *parents, leaf = dotted.split(".")
        node = expected
        for part in parents:
            node = node.setdefault(part, {})
        assert node.get(leaf) != value, f"{dotted} is the recipe's already: not an override"
        node[leaf] = value
    found = yaml.safe_load(text)
    assert found == expected, _differences(expected, found)
    assert _plan(text, ())["fits"], "g2rpo plan refuses the ConfigMap's config"


def _differences(want, got, path="") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got), key=str):
            out += _differences(want.get(k), got.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if want == got else [f"{path}: recipe + overrides {want!r}, ConfigMap {got!r}"]


def test_the_cpu_overlay_is_small():
    """The tiny world on a CPU try-out cluster: small pods, and no claim but the runs'."""
    docs = _rendered("cpu")
    cfg, _, _, redis = _job_config(docs)
    assert cfg.model.device == "cpu" and cfg.train.reward.job_replicas(redis) == 0
    for doc in docs.values():
        for template in _pod_templates(doc):
            for c in template["spec"]["containers"]:
                memory = c["resources"].get("limits", {}).get("memory", "0")
                assert _quantity(memory) <= 16 * 2**30, (doc["metadata"]["name"], memory)
            claims = {
                v["persistentVolumeClaim"]["claimName"]
                for v in template["spec"].get("volumes", [])
                if "persistentVolumeClaim" in v
            }
            assert claims <= {"g2rpo-runs"}, (doc["metadata"]["name"], claims)
    # the job finds the reward-service replicas with their token, and they serve its rewards
    args = " ".join(
        docs["Deployment/reward-server"]["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert f"--token-env={cfg.train.reward.token_env}" in args
    served = re.search(r"--scorers=(\S+)", args).group(1).split(",")
    assert {r.name for r in cfg.rewards} <= set(served)


def test_prometheus_rule_is_generated_from_the_rule_files():
    sys.path.insert(0, str(DEPLOY / "k8s"))
    try:
        import prometheus_rule
    finally:
        sys.path.pop(0)
    committed = (DEPLOY / "k8s/base/monitoring/prometheus-rules.yaml").read_text()
    assert committed == prometheus_rule.prometheus_rule(), (
        "regenerate: .venv/bin/python deploy/k8s/prometheus_rule.py "
        "> deploy/k8s/base/monitoring/prometheus-rules.yaml"
    )
