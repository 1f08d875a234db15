"""deploy/k8s offline, as the real kustomize renders it (kubectl's, tests/kustomize_render.py):
every core manifest (and every pod template inside KubeRay and Deployment objects)
validates strictly against the Kubernetes 1.37 schemas; RayCluster and RayJob carry
KubeRay's required fields; the overlays' patches and components apply to the base; the
generated PrometheusRule is what its generator writes; docker-compose's services point at
files that exist.

And the KubeRay manifests, as each overlay renders them, can run the config their job
names: the ConfigMap is a shipped recipe plus the stated deploy overrides and `g2rpo plan`
passes it; the worker pods hold the recipe's `# hardware:` GPUs with one pod holding the
whole learner group (its STRICT_PACK placement group); every Ray pod mounts the run
directory (one claim at run.output_dir); /dev/shm holds the object store. What the
operator, Kubernetes and kube-prometheus-stack make of them: tests/test_operator_conformance.py."""

import functools
import json
import math
import re
import shlex
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kustomize_render import render, render_with_components

REPO = Path(__file__).parents[1]
DEPLOY = REPO / "deploy"
K8S_VERSION = "1.37.0"
CORE = {"v1", "apps/v1", "autoscaling/v2", "networking.k8s.io/v1"}
HARDWARE = re.compile(r"^# hardware: (\d+) x (\d+(?:\.\d+)?)GiB GPUs$", re.M)
RECIPE = re.compile(r"^# recipe: (\S+)$", re.M)
GPU = "nvidia.com/gpu"
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
RENDERS = ["base", "cpu", "gpu"]


def _base() -> dict[str, dict]:
    return render(DEPLOY / "k8s/base")


def _rendered(name: str) -> dict[str, dict]:
    """The base or an overlay as kustomize renders it, by "Kind/name"."""
    return _base() if name == "base" else render(DEPLOY / f"k8s/overlays/{name}")


def _with_reward_service() -> dict[str, dict]:
    return render_with_components(DEPLOY / "k8s/base", DEPLOY / "k8s/components/reward-service")


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


# --------------------------------------------------------------------- the Ray pods


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
    from g2rpo.common.config import config_from_dict

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


def test_compose_documents_a_training_run_it_serves():
    """The `g2rpo train` command docker-compose's header documents runs a config of the
    repo that `g2rpo plan` passes on one host, against this compose file: its Redis port,
    the replicas' token variable (exported in the same shell) and scorers, the metrics
    port Prometheus scrapes; and the header says where its run directory lands."""
    compose_dir = DEPLOY / "compose"
    text = (compose_dir / "docker-compose.yaml").read_text()
    header = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("#")]
    start = next(i for i, ln in enumerate(header) if ln.startswith("g2rpo train "))
    command = []
    for line in header[start:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    args = shlex.split(" ".join(command), comments=True)
    config = args[args.index("--config") + 1]
    sets = tuple(args[i + 1] for i, a in enumerate(args) if a == "--set")
    redis = args[args.index("--redis-url") + 1]
    assert (REPO / config).is_file(), config
    recipe = (REPO / config).read_text()
    cfg = _config_of(recipe, sets)
    plan = _plan(recipe, sets)
    assert plan["fits"] and plan["gpus_asked"] <= 8, "not a one-host run g2rpo plan passes"

    compose = yaml.safe_load(text)
    services = compose["services"]
    (published,) = services["redis"]["ports"]
    assert redis.startswith(f"redis://{published.rsplit(':', 1)[0]}/"), (redis, published)
    assert cfg.train.reward.job_replicas(redis) == 0  # the compose replicas, not its own
    token = cfg.train.reward.token_env
    assert f"export {token}=" in text, "the token must reach the training shell too"
    for name in ("reward-1", "reward-2"):
        command = services[name]["command"]
        assert command[command.index("--token-env") + 1] == token
        assert token in services[name]["environment"]
        served = command[command.index("--scorers") + 1].split(",")
        assert {r.name for r in cfg.rewards} <= set(served), (name, served)
    targets = json.loads((compose_dir / "targets/train.json").read_text())
    assert targets[0]["targets"][0].endswith(f":{cfg.train.metrics.port}"), targets
    where = Path(cfg.run.output_dir) / cfg.run.name
    assert f"./{where}" in text or str(where) in text, f"the header never says {where}"


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
