"""What the KubeRay operator makes of our RayCluster and RayJob manifests: the head
Service, the pods with their labels, ports, commands and health probes, the RayJob's
submitter pod and its retries. Written from ray-project/kuberay at tag v1.7.0 (the release
docs/deploy.md pins; the newest stable tag, ray.io/v1), functions named at each, under
ray-operator/controllers/ray/ unless said; the operator's defaults as its Helm chart
installs them (no ENABLE_* variables set: probes and the wait-gcs-ready init container
injected, no login shell, no feature gate beyond the chart's)."""

from __future__ import annotations

import copy
import re
import shlex

KUBERAY_VERSION = "1.7.0"
# the names the operator gives what it creates, for a cluster of the RayJob g2rpo-train
# (utils/util.go GenerateRayClusterName: the job's name and 5 random characters)
JOB_CLUSTER = "{job}-x7k2q"

# utils/constant.go
METRICS_PORT_NAME, DEFAULT_METRICS_PORT = "metrics", 8080
DEFAULT_PORTS = {
    "client": 10001,
    "gcs-server": 6379,
    "dashboard": 8265,
    "metrics": 8080,
    "serve": 8000,
}
DASHBOARD_AGENT_LISTEN_PORT = 52365
WGET_HEALTH = "wget --tries 1 -T {timeout} -q -O- http://localhost:{port}/{path} | grep success"
PYTHON_HEALTH = (
    "python -c \"import urllib.request; r=urllib.request.urlopen('{url}', timeout={timeout});"
    " exit(0 if b'success' in r.read() else 1)\""
)
UNIFIED_HEALTH_CHECK_FROM = (2, 53, 0)  # common/pod.go supportsUnifiedHealthCheck


def head_service_ports(spec: dict) -> dict[str, int]:
    """common/service.go getServicePorts: the head container's ports by name (unnamed:
    "<port>-port"; a later one of the same name replaces the earlier), the defaults when
    it names none, and `metrics: 8080` added when no port is named `metrics`."""
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    ports = {
        p.get("name") or f"{p['containerPort']}-port": p["containerPort"]
        for p in head.get("ports") or []
    }
    if not ports:
        ports = dict(DEFAULT_PORTS)
    ports.setdefault(METRICS_PORT_NAME, DEFAULT_METRICS_PORT)
    return ports


def head_service(cluster: str, namespace: str, spec: dict, rayjob: str | None = None) -> dict:
    """common/service.go BuildServiceForHeadPod: a headless ClusterIP Service, one port
    per getServicePorts entry (appProtocol tcp, sorted by name), selecting HeadServiceLabels
    with app.kubernetes.io/name taken from the labels its caller passes: the head
    template's (raycluster_controller.go reconcileHeadService) or none, so `kuberay`, for
    a RayJob's own <job>-head-svc (common/job.go BuildHeadServiceForRayJob, which also
    renames and relabels it)."""
    head_labels = spec["headGroupSpec"]["template"].get("metadata", {}).get("labels") or {}
    passed = {} if rayjob else head_labels
    selector = {
        "ray.io/cluster": cluster,
        "ray.io/node-type": "head",
        "ray.io/identifier": f"{cluster}-head",
        "app.kubernetes.io/name": passed.get("app.kubernetes.io/name", "kuberay"),
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    labels = dict(selector)
    if rayjob:
        labels = {
            "ray.io/originated-from-cr-name": rayjob,
            "ray.io/originated-from-crd": "RayJob",
            "ray.io/node-type": "head",
            "ray.io/identifier": f"{rayjob}-head",
        }
    ports = [
        {"name": name, "port": port, "appProtocol": "tcp"}
        for name, port in sorted(head_service_ports(spec).items())
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{rayjob or cluster}-head-svc",
            "namespace": namespace,
            "labels": labels,
        },
        "spec": {
            "selector": selector,
            "ports": ports,
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
        },
    }


def pod_labels(node_type: str, cluster: str, group: str, template_labels: dict) -> dict:
    """common/pod.go labelPod: KubeRay's labels, then the template's over them except
    ray.io/node-type, ray.io/group and ray.io/cluster, which stay KubeRay's."""
    labels = {
        "ray.io/is-ray-node": "yes",
        "ray.io/cluster": cluster,
        "ray.io/node-type": node_type,
        "ray.io/group": group,
        "ray.io/identifier": f"{cluster}-{node_type}",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    fixed = {"ray.io/node-type", "ray.io/group", "ray.io/cluster"}
    labels.update({k: v for k, v in template_labels.items() if k not in fixed})
    return labels


def _version(text: str) -> tuple[int, ...] | None:
    """apimachinery util/version ParseGeneric: "[v]X.Y[.Z...]" then anything; else None."""
    m = re.match(r"^\s*v?([0-9]+(?:\.[0-9]+)+)", text or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def health_probes(node_type: str, ray_version: str, params: dict) -> dict:
    """common/pod.go initLivenessAndReadinessProbe for a container that sets none: from
    Ray 2.53 (supportsUnifiedHealthCheck) an HTTP GET of the dashboard agent's /api/healthz;
    below it, or for a rayVersion it cannot parse, `bash -c` running wget | grep (the
    raylet's health on the agent; the head also the GCS's on the dashboard)."""
    agent = int(params.get("dashboard-agent-listen-port", DASHBOARD_AGENT_LISTEN_PORT))
    version = _version(ray_version)
    if version is not None and version >= UNIFIED_HEALTH_CHECK_FROM:
        action = {"httpGet": {"path": "/api/healthz", "port": agent}}
    else:
        checks = [WGET_HEALTH.format(timeout=2, port=agent, path="api/local_raylet_healthz")]
        if node_type == "head":
            dashboard = int(params.get("dashboard-port", DEFAULT_PORTS["dashboard"]))
            checks.append(WGET_HEALTH.format(timeout=10, port=dashboard, path="api/gcs_healthz"))
        action = {"exec": {"command": ["bash", "-c", " && ".join(checks)]}}
    return {"livenessProbe": dict(action), "readinessProbe": dict(action)}


def _ray_container(template: dict, node_type: str, ray_version: str, params: dict) -> dict:
    """common/pod.go DefaultHeadPodTemplate/DefaultWorkerPodTemplate and BuildPod on the
    Ray container (the first): a `metrics: 8080` port added when none is named metrics,
    command `/bin/bash -c --` with `ulimit -n ...; ray start ...` (our containers set no
    command), the probes it does not set."""
    container = copy.deepcopy(template["spec"]["containers"][0])
    ports = container.setdefault("ports", [])
    if not any(p.get("name") == METRICS_PORT_NAME for p in ports):
        ports.append({"name": METRICS_PORT_NAME, "containerPort": DEFAULT_METRICS_PORT})
    if "ray start" not in " ".join(container.get("command", []) + container.get("args", [])):
        start = "ray start --head" if node_type == "head" else "ray start"
        container["command"] = ["/bin/bash", "-c", "--"]
        container["args"] = [f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {start} --block"]
    for kind, probe in health_probes(node_type, ray_version, params).items():
        container.setdefault(kind, probe)
    return container


def _pod(name: str, namespace: str, labels: dict, spec: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def cluster_pods(cluster: str, namespace: str, spec: dict) -> list[dict]:
    """The pods the operator creates for a RayClusterSpec: the head, and one pod per
    replica of each worker group, each with labelPod's labels; a worker also gets the
    wait-gcs-ready init container (DefaultWorkerPodTemplate), which runs `ray
    health-check` against the head Service until the GCS answers."""
    version = spec.get("rayVersion", "")
    head = spec["headGroupSpec"]
    pods = []
    groups = [("head", "headgroup", head, 1)]
    for g in spec["workerGroupSpecs"]:
        groups.append(("worker", g["groupName"], g, g.get("replicas", 1)))
    for node_type, group, group_spec, replicas in groups:
        template = group_spec["template"]
        own = template.get("metadata", {}).get("labels") or {}
        labels = pod_labels(node_type, cluster, group, own)
        pod_spec = copy.deepcopy(template["spec"])
        container = _ray_container(template, node_type, version, group_spec["rayStartParams"])
        pod_spec["containers"] = [container, *pod_spec["containers"][1:]]
        if node_type == "worker":
            wait = (
                "SECONDS=0\nwhile true; do\n if (( SECONDS <= 120 )); then\n"
                "  if ray health-check --address {svc}:6379 > /dev/null 2>&1; then\n"
                '   echo "GCS is ready."\n   break\n  fi\n else\n'
                "  if ray health-check --address {svc}:6379; then break; fi\n fi\n"
                " sleep 5\ndone"
            )
            svc = f"{cluster}-head-svc.{namespace}.svc.cluster.local"
            pod_spec["initContainers"] = [
                *(pod_spec.get("initContainers") or []),
                {
                    "name": "wait-gcs-ready",
                    "image": container["image"],
                    "command": ["/bin/bash", "-c", "--"],
                    "args": [wait.format(svc=svc)],
                },
            ]
        for i in range(max(replicas, 1)):
            suffix = "head" if node_type == "head" else f"{group}-worker-{i}"
            pods.append(_pod(f"{cluster}-{suffix}", namespace, dict(labels), pod_spec))
    return pods


def submitter_pod(job: dict, namespace: str) -> dict:
    """The RayJob's submitter (K8sJobMode, the default): rayjob_controller.go
    getSubmitterTemplate copies submitterPodTemplate, sets the command `/bin/bash -ce --`
    with common/job.go BuildJobSubmitCommand when the container has none, and adds labels
    ray.io/originated-from-cr-name/-crd and app.kubernetes.io/created-by; createNewK8sJob
    makes it a Job named after the RayJob, whose pods Kubernetes labels too
    (pkg/registry/batch/job/strategy.go generateSelector: job-name, controller-uid and
    their batch.kubernetes.io/ forms)."""
    name = job["metadata"]["name"]
    template = copy.deepcopy(job["spec"]["submitterPodTemplate"])
    container = template["spec"]["containers"][0]
    if not container.get("command"):
        address = f"http://{name}-head-svc.{namespace}.svc.cluster.local:8265"
        health = PYTHON_HEALTH.format(url=f"{address}/api/gcs_healthz", timeout=10)
        submission = JOB_CLUSTER.format(job=name)
        container["command"] = ["/bin/bash", "-ce", "--"]
        container["args"] = [
            f"until {health} >/dev/null 2>&1 ; do echo waiting ; sleep 2 ; done ; "
            f"if ! ray job status --address {address} {submission} >/dev/null 2>&1 ; then "
            f"ray job submit --address {address} --no-wait --submission-id {submission} -- "
            f"{job['spec']['entrypoint'].strip()} ; fi ; "
            f"ray job logs --address {address} --follow {submission}"
        ]
    labels = dict(template.get("metadata", {}).get("labels") or {})
    labels.update(
        {
            "ray.io/originated-from-cr-name": name,
            "ray.io/originated-from-crd": "RayJob",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
    )
    for key in ("job-name", "batch.kubernetes.io/job-name"):
        labels.setdefault(key, name)
    for key in ("controller-uid", "batch.kubernetes.io/controller-uid"):
        labels.setdefault(key, "00000000-0000-0000-0000-000000000000")
    return _pod(f"{name}-submitter", namespace, labels, template["spec"])


def created_pods(docs: dict[str, dict]) -> list[dict]:
    """Every pod the operator creates for the rendered manifests: the RayJob's cluster
    and submitter, the standing RayCluster's (once unsuspended)."""
    pods = []
    for doc in docs.values():
        namespace = doc["metadata"].get("namespace", "default")
        if doc["kind"] == "RayJob":
            cluster = JOB_CLUSTER.format(job=doc["metadata"]["name"])
            pods += cluster_pods(cluster, namespace, doc["spec"]["rayClusterSpec"])
            pods.append(submitter_pod(doc, namespace))
        elif doc["kind"] == "RayCluster":
            pods += cluster_pods(doc["metadata"]["name"], namespace, doc["spec"])
    return pods


def head_services(docs: dict[str, dict]) -> list[dict]:
    """The head Services: the RayCluster controller's for each cluster (reconcileHeadService),
    and for a RayJob also the RayJob controller's <job>-head-svc (reconcileServices)."""
    services = []
    for doc in docs.values():
        namespace = doc["metadata"].get("namespace", "default")
        if doc["kind"] == "RayJob":
            spec, name = doc["spec"]["rayClusterSpec"], doc["metadata"]["name"]
            cluster = JOB_CLUSTER.format(job=name)
            services.append(head_service(cluster, namespace, spec))
            services.append(head_service(cluster, namespace, spec, rayjob=name))
        elif doc["kind"] == "RayCluster":
            services.append(head_service(doc["metadata"]["name"], namespace, doc["spec"]))
    return services


def attempts(backoff_limit: int | None) -> int:
    """rayjob_controller.go checkBackoffLimitAndUpdateStatusIfNeeded: a Failed RayJob goes
    Retrying while its failures stay below backoffLimit + 1 (unset: never); so the job is
    tried backoffLimit + 1 times. Retrying deletes the RayCluster and the submitter Job and
    clears status.rayClusterName and status.jobId; initRayJobStatusIfNeed then names a new
    cluster (from the same rayClusterSpec) and a new submission id."""
    return 1 if backoff_limit is None else backoff_limit + 1


_KEYWORDS = {"if", "then", "else", "elif", "fi", "while", "until", "do", "done", "!", "{", "}"}
_BUILTINS = {
    "echo",
    "ulimit",
    "exit",
    "true",
    "false",
    "cd",
    "export",
    "set",
    "test",
    "[",
    "break",
    "continue",
    "return",
}


def commands_run(argv: list[str]) -> set[str]:
    """The programs an exec'd argv runs: its first word, and for `bash -c SCRIPT` each
    simple command of the script that is not a shell keyword, builtin or assignment."""
    found = {argv[0]}
    if argv[0].rsplit("/", 1)[-1] in ("bash", "sh") and len(argv) > 1:
        script = next((a for a in argv[1:] if not a.startswith("-")), "")
        script = re.sub(r"\(\(.*?\)\)", "true", script.replace("\n", ";"))
        lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True  # words end at blanks and those operators only
        at_start = True
        for token in lexer:
            if token in (";", "&&", "||", "|", "(", ")", ";;") or token in _KEYWORDS:
                at_start = True
            elif at_start:
                at_start = False
                if "=" not in token and token not in _BUILTINS:
                    found.add(token)
    return found
