"""Who reaches what in the deployment, and with which secrets (issue 55): the
NetworkPolicies of each render, evaluated as the NetworkPolicy spec states (tests/
k8s_rules.py) over the pods the KubeRay operator really creates (tests/kuberay_model.py,
v1.7.0: the labels it adds and keeps); the Secrets the manifests use, none shipped, all
created by the docs' commands; and Redis, run from its manifest's args, refusing clients
without the password. Each test failed on 3bb9114's manifests and says what it caught."""

from __future__ import annotations

import re
import secrets
import socket
import subprocess
import time

import pytest
import redis as redis_py
from deploy_facts import (
    created_secrets,
    helm_installs,
    namespace_labels,
    namespaces_created,
    running_pods,
)
from deploy_render import RENDERS, _job_config, _rendered, _with_reward_service
from k8s_rules import Pod, expand, ingress_allowed, selects
from redis.backoff import NoBackoff
from redis.retry import Retry

ADMIN_NAMESPACE = "g2rpo-admin"  # deploy/k8s/base/network-policy.yaml `ray-from-admin`
# the kuberay-operator chart's pod labels (helm-chart/kuberay-operator/templates/
# deployment.yaml at v1.7.0, release kuberay-operator) and a Prometheus pod's
OPERATOR_LABELS = {
    "app.kubernetes.io/name": "kuberay-operator",
    "app.kubernetes.io/instance": "kuberay-operator",
    "app.kubernetes.io/component": "kuberay-operator",
}
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus", "prometheus": "kps-prometheus"}
RAY_PORTS = (6379, 8265, 10001, 8080, 52365, 45678)  # GCS, Jobs API, client, metrics, agent, any


def _policy(ingress, selector=None, namespace="ns") -> dict:
    spec = {"podSelector": selector or {}, "policyTypes": ["Ingress"], "ingress": ingress}
    return {"metadata": {"name": "p", "namespace": namespace}, "spec": spec}


def test_the_network_policy_evaluator_follows_the_spec():
    """The evaluator on known answers (staging/src/k8s.io/api/networking/v1/types.go):
    unselected pods take all; an empty ingress list denies; policies add up; a peer with
    both selectors is their AND, two peers an OR; empty selectors select all; ports by
    number, range, name and protocol."""
    spaces = {"ns": {"team": "a"}, "other": {"team": "b"}}
    dst = Pod("dst", "ns", {"app": "db"}, {"sql": 5432})
    web, web_there = Pod("w", "ns", {"app": "web"}), Pod("w2", "other", {"app": "web"})
    anon = Pod("x", "ns", {})
    assert ingress_allowed([], spaces, anon, dst, 5432)
    deny = _policy([])
    assert not ingress_allowed([deny], spaces, web, dst, 5432)
    allow_web = _policy([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}])
    assert ingress_allowed([deny, allow_web], spaces, web, dst, 1)  # additive
    assert not ingress_allowed([deny, allow_web], spaces, web_there, dst, 1)  # own namespace
    both = {"namespaceSelector": {"matchLabels": {"team": "b"}}, "podSelector": {}}
    assert ingress_allowed([_policy([{"from": [both]}])], spaces, web_there, dst, 1)
    assert not ingress_allowed([_policy([{"from": [both]}])], spaces, web, dst, 1)
    anded = {**both, "podSelector": {"matchLabels": {"app": "web"}}}
    ored = [{"namespaceSelector": {"matchLabels": {"team": "b"}}}, {"podSelector": {}}]
    lone = Pod("y", "other", {})
    assert not ingress_allowed([_policy([{"from": [anded]}])], spaces, lone, dst, 1)
    assert ingress_allowed([_policy([{"from": ored}])], spaces, lone, dst, 1)
    everywhere = _policy([{"from": [{"namespaceSelector": {}}]}])
    assert ingress_allowed([everywhere], spaces, lone, dst, 1)
    ports = _policy([{"ports": [{"port": "sql"}, {"port": 7000, "endPort": 7002}]}])
    assert ingress_allowed([ports], spaces, anon, dst, 5432)
    assert ingress_allowed([ports], spaces, anon, dst, 7002)
    assert not ingress_allowed([ports], spaces, anon, dst, 7003)
    assert not ingress_allowed([ports], spaces, anon, dst, 5432, protocol="UDP")
    other_pods = _policy(
        [], selector={"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]}
    )
    assert ingress_allowed([other_pods], spaces, anon, dst, 1)  # selects not dst
    assert selects({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, {})
    assert not selects(None, {}) and selects({}, {"any": "thing"})


def _pods_by_role(pods: list[Pod]) -> dict[str, list[Pod]]:
    """The pods of a render by what they are, from the labels they run with."""
    roles: dict[str, list[Pod]] = {}
    for pod in pods:
        labels = pod.labels
        if "ray.io/node-type" in labels:
            cluster = "job" if labels["ray.io/cluster"].startswith("g2rpo-train") else "standing"
            roles.setdefault(f"{cluster}-{labels['ray.io/node-type']}", []).append(pod)
            roles.setdefault("ray", []).append(pod)
        elif labels.get("ray.io/originated-from-crd") == "RayJob":
            roles.setdefault("submitter", []).append(pod)
        else:
            roles.setdefault(labels.get("app.kubernetes.io/name", pod.name), []).append(pod)
    return roles


@pytest.mark.parametrize("render", RENDERS)
def test_network_policies_let_in_only_who_they_should(render):
    """Catches 3bb9114: no NetworkPolicy covered the Ray pods, so any pod of any namespace
    reached the dashboard and Jobs API (8265, dashboard-host 0.0.0.0), the GCS (6379) and
    the Ray client (10001), and Redis took every pod of this deployment. Now each Ray
    cluster takes its own pods on any port; the submitter, the KubeRay operator (in the
    namespace the docs install it) and the admin namespace the Jobs API; the monitoring
    namespace the metrics ports; Redis only the Ray and reward-server pods."""
    docs = {**_with_reward_service(), **_rendered(render)}  # the standing reward servers too
    policies = [d for d in docs.values() if d["kind"] == "NetworkPolicy"]
    operator_ns = helm_installs()["kuberay-operator"].namespace
    monitoring_ns = helm_installs()["kube-prometheus-stack"].namespace
    assert ADMIN_NAMESPACE in namespaces_created(), "the docs create no admin namespace"
    spaces = namespace_labels(docs, operator_ns, monitoring_ns, ADMIN_NAMESPACE, "default")
    roles = _pods_by_role([p for p, _ in running_pods(docs)])
    for role in ("job-head", "job-worker", "standing-head", "standing-worker", "submitter"):
        assert roles.get(role), f"no {role} pod in the render"
    assert roles.get("redis") and roles.get("reward-server"), sorted(roles)
    heads = roles["job-head"] + roles["standing-head"]
    outsiders = {
        "operator": Pod("op", operator_ns, OPERATOR_LABELS),
        "prometheus": Pod("prom", monitoring_ns, PROMETHEUS_LABELS),
        "admin": Pod("admin", ADMIN_NAMESPACE, {}),
        "stranger": Pod("stranger", "default", {"app.kubernetes.io/part-of": "g2rpo"}),
        "unlabelled": Pod("unlabelled", "g2rpo", {}),
        "lookalike": Pod("lookalike", "g2rpo", {"app.kubernetes.io/part-of": "g2rpo"}),
    }
    want: list[tuple[Pod, Pod, int, bool]] = []
    for name in ("stranger", "unlabelled", "lookalike"):
        src = outsiders[name]
        want += [(src, head, port, False) for head in heads for port in (8265, 6379, 10001)]
        want += [(src, pod, 6379, False) for pod in roles["redis"]]
        want += [(src, pod, 8300, False) for pod in roles["reward-server"]]
    for cluster in ("job", "standing"):
        own = roles[f"{cluster}-head"] + roles[f"{cluster}-worker"]
        other = "standing" if cluster == "job" else "job"
        foreign = roles[f"{other}-head"] + roles[f"{other}-worker"]
        want += [(a, b, port, True) for a in own for b in own for port in RAY_PORTS if a != b]
        want += [(a, b, 6379, False) for a in foreign for b in own]
    for submitter in roles["submitter"]:
        want += [(submitter, h, 8265, True) for h in roles["job-head"]]
        want += [(submitter, h, 6379, False) for h in roles["job-head"]]
        want += [(submitter, h, 8265, False) for h in roles["standing-head"]]
        want += [(submitter, r, 6379, False) for r in roles["redis"]]
    for name in ("operator", "admin"):
        want += [(outsiders[name], h, 8265, True) for h in heads]
        want += [(outsiders[name], h, port, False) for h in heads for port in (6379, 10001)]
        want += [(outsiders[name], r, 6379, False) for r in roles["redis"]]
    prom = outsiders["prometheus"]
    want += [(prom, pod, 8080, True) for pod in roles["ray"]]
    want += [(prom, h, 9400, True) for h in heads]
    want += [(prom, h, port, False) for h in heads for port in (8265, 6379, 10001)]
    want += [(prom, pod, 8300, True) for pod in roles["reward-server"]]
    want += [(prom, r, 6379, False) for r in roles["redis"]]
    clients = roles["ray"] + roles["reward-server"]
    want += [(c, r, 6379, True) for c in clients for r in roles["redis"]]
    want += [(c, s, 8300, True) for c in roles["ray"] for s in roles["reward-server"]]
    wrong = [
        f"{src.name} ({src.namespace}) -> {dst.name}:{port}: {'refused' if ok else 'let in'}"
        for src, dst, port, ok in want
        if ingress_allowed(policies, spaces, src, dst, port) != ok
    ]
    assert not wrong, f"{len(wrong)} of {len(want)} wrong:\n" + "\n".join(wrong[:40])


# ----------------------------------------------------------------------------- secrets

SECRET_NAME = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|AUTH|API_KEY", re.I)


def _containers(spec: dict) -> list[dict]:
    return spec.get("containers", []) + spec.get("initContainers", [])


@pytest.mark.parametrize("render", RENDERS)
def test_no_rendered_object_holds_a_secret(render):
    """Catches 3bb9114's placeholder Secret `reward-token` (token `change-me`), which
    every `kubectl apply -k` restored over the user's real one, and a Redis without a
    password. Now no Secret is rendered; every secret-looking variable comes from a
    secretKeyRef naming a Secret and key the docs' commands create; Redis requires
    its password from one, and every Redis client gets it: the Ray heads (the driver,
    through train.reward.redis_password_env) and the reward servers (the flag)."""
    from g2rpo.cli import build_parser

    docs = {**_with_reward_service(), **_rendered(render)}  # the standing reward servers too
    made = created_secrets()
    problems = [
        f"{key}: a Secret in the manifests" for key, d in docs.items() if d["kind"] == "Secret"
    ]
    refs: dict[tuple[str, str], set[str]] = {}
    for pod, spec in running_pods(docs):
        for c in _containers(spec):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.setdefault((ref["name"], ref["key"]), set()).add(env["name"])
                    if ref["key"] not in made.get(ref["name"], set()):
                        problems.append(f"{pod.name}: {ref} is no Secret the docs create")
                elif SECRET_NAME.search(env["name"]) and "value" in env:
                    problems.append(f"{pod.name}: {env['name']} is written in the manifest")
            args = c.get("command", []) + c.get("args", [])
            for i, arg in enumerate(args[:-1]):
                if arg in ("--requirepass", "--masterauth") and not re.fullmatch(
                    r"\$\(\w+\)", args[i + 1]
                ):
                    problems.append(f"{pod.name}: {arg} {args[i + 1]!r} is a literal")
    redis = docs["Deployment/redis"]["spec"]["template"]["spec"]
    if "--requirepass" not in redis["containers"][0]["args"]:
        problems.append("Redis takes clients without a password (no --requirepass)")
    cfg, *_ = _job_config(docs)
    var = cfg.train.reward.redis_password_env
    if not var:
        problems.append("train.reward.redis_password_env: the driver sends no Redis password")
    for pod, spec in running_pods(docs):
        env = {
            e["name"]: e.get("valueFrom", {}).get("secretKeyRef")
            for e in spec["containers"][0].get("env", [])
        }
        is_head = pod.labels.get("ray.io/node-type") == "head"
        if is_head and (env.get(var) or {}).get("name") != "redis-password":
            problems.append(f"{pod.name}: no {var} from the redis-password Secret")
        if pod.labels.get("app.kubernetes.io/name") == "reward-server":
            server = build_parser().parse_args(spec["containers"][0]["args"])
            if (env.get(server.redis_password_env or "") or {}).get("name") != "redis-password":
                problems.append(f"{pod.name}: --redis-password-env names no redis-password var")
    assert not problems, "\n".join(problems)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_redis_refuses_clients_without_the_password(tmp_path):
    """Catches 3bb9114's Redis (no --requirepass: any pod could read and rewrite replica
    discovery, the score cache and run status). Runs the real redis-server with the
    Deployment's args as the kubelet expands them ($(REDIS_PASSWORD) from the Secret's
    value through the container's env), then: a client without the password, or with a
    wrong one, is refused; the readiness probe as written, with the env it runs with,
    passes (and would fail against NOAUTH: plain `redis-cli ping` exits 0 on it)."""
    deployment = _rendered("base")["Deployment/redis"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    password = secrets.token_hex(32)  # what `openssl rand -hex 32` gives
    env = {}
    for e in container.get("env", []):  # each Secret-backed variable, as the docs create it
        ref = e["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("redis-password", "password"), ref
        env[e["name"]] = password
    args = [expand(a, env) for a in container["args"]]
    assert password in args and "$(" not in " ".join(args), f"no password in Redis' args {args}"
    port = _free_port()
    # the image's entrypoint runs redis-server with args that start with "-"; here it binds
    # loopback on a free port and keeps its files in tmp_path (the pod's port is 6379)
    server = subprocess.Popen(
        ["redis-server", *args, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        probe = container["readinessProbe"]["exec"]["command"]
        assert probe[0] == "redis-cli", probe
        with_port = [probe[0], "-p", str(port), *probe[1:]]

        def run(argv, extra_env):
            return subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=10,
                env={"PATH": "/usr/bin:/bin", **extra_env},
            )

        deadline = time.monotonic() + 10
        while run(with_port, env).returncode and time.monotonic() < deadline:
            time.sleep(0.05)
        ready = run(with_port, env)
        assert ready.returncode == 0 and "PONG" in ready.stdout, ready
        anonymous = run(with_port, {})
        assert anonymous.returncode != 0 and "NOAUTH" in anonymous.stdout + anonymous.stderr
        wrong = run(with_port, {"REDISCLI_AUTH": password[::-1]})
        assert wrong.returncode != 0, wrong
        once = Retry(NoBackoff(), 0)  # no retry on refusal
        with pytest.raises(redis_py.exceptions.AuthenticationError):
            redis_py.Redis(port=port, socket_timeout=5, retry=once).ping()
        assert redis_py.Redis(port=port, password=password, socket_timeout=5).ping()
    finally:
        server.terminate()
        server.wait(timeout=10)
