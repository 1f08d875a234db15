"""Kubernetes' own rules, as its source states them, for the deploy tests (issue 55): label
selectors, what the API server refuses in a Service and in container ports, the kubelet's
$(VAR) expansion, NetworkPolicy ingress, the scheduler's required pod affinity. Read from
kubernetes/kubernetes (stored copies, master of late 2026; the function named at each
rule) and written anew here: a deployment is checked against what the system that runs it
does with it, not against our reading of the docs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# IsDNS1123Label (apimachinery/pkg/util/validation/validation.go)
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# IsValidPortName: IANA_SVC_NAME, at most 15 characters, a letter among them, no "--"
PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def selects(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector (staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/
    helpers.go), then Matches: a nil selector matches nothing, an empty one everything;
    every matchLabels pair and every matchExpressions requirement must hold (AND)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req["key"], req["operator"], req.get("values") or []
        # labels.NewRequirement: In/NotIn need values, Exists/DoesNotExist none
        if (op in ("In", "NotIn")) != bool(values):
            raise ValueError(f"selector requirement {req}: invalid values for {op}")
        if op == "In":
            held = key in labels and labels[key] in values
        elif op == "NotIn":
            held = key not in labels or labels[key] not in values
        elif op == "Exists":
            held = key in labels
        elif op == "DoesNotExist":
            held = key not in labels
        else:
            raise ValueError(f"{op!r} is not a valid pod selector operator")
        if not held:
            return False
    return True


def service_errors(service: dict) -> list[str]:
    """What ValidateService and validateServicePort (pkg/apis/core/validation/
    validation.go) refuse in spec.ports, after SetDefaults_Service (pkg/apis/core/v1/
    defaults.go) gives each port protocol TCP: a port name that is no DNS-1123 label, a
    missing name when there are several ports, a name twice, a port out of range, and
    the same (protocol, port) twice ("Duplicate value")."""
    ports = service["spec"].get("ports") or []
    errors, names, keys = [], set(), set()
    for i, port in enumerate(ports):
        name, number = port.get("name", ""), port.get("port", 0)
        protocol = port.get("protocol") or "TCP"
        if not name and len(ports) > 1:
            errors.append(f"spec.ports[{i}].name: Required value")
        elif name:
            if not DNS1123_LABEL.match(name) or len(name) > 63:
                errors.append(f"spec.ports[{i}].name: Invalid value {name!r}")
            if name in names:
                errors.append(f"spec.ports[{i}].name: Duplicate value {name!r}")
            names.add(name)
        if not 1 <= number <= 65535:
            errors.append(f"spec.ports[{i}].port: Invalid value {number}")
        if (protocol, number) in keys:
            errors.append(f"spec.ports[{i}]: Duplicate value {{{protocol} {number}}}")
        keys.add((protocol, number))
    return errors


def container_port_errors(container: dict) -> list[str]:
    """validateContainerPorts (pkg/apis/core/validation/validation.go): each named port's
    name a valid port name (IsValidPortName), no name twice. The same containerPort twice
    is only a warning (pkg/api/pod/warnings.go), so not here."""
    errors, names = [], set()
    for i, port in enumerate(container.get("ports") or []):
        name = port.get("name", "")
        if not name:
            continue
        where = f"{container['name']}.ports[{i}].name"
        valid = (
            len(name) <= 15
            and PORT_NAME.match(name)
            and "--" not in name
            and re.search("[a-z]", name)
        )
        if not valid:
            errors.append(f"{where}: Invalid value {name!r}")
        elif name in names:
            errors.append(f"{where}: Duplicate value {name!r}")
        names.add(name)
    return errors


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's $(VAR) expansion of command, args and env values
    (third_party/forked/golang/expansion/expand.go Expand, MappingFuncFor): $(NAME) of a
    defined variable becomes its value, of an undefined one stays as written; $$ is a
    literal $; any other $ stays."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                close = text.find(")", i + 2)
                if close != -1:
                    name = text[i + 2 : close]
                    out.append(env.get(name, f"$({name})"))
                    i = close + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


# ---------------------------------------------------------------- NetworkPolicy ingress


@dataclass(frozen=True)
class Pod:
    """A pod as a policy sees it: where it is, its labels, its containers' named ports."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    ports: Mapping[str, int] = field(default_factory=dict)  # name -> containerPort (TCP)


def _policy_types(spec: dict) -> list[str]:
    """NetworkPolicySpec.policyTypes (staging/src/k8s.io/api/networking/v1/types.go):
    unset, Ingress always, Egress too when there are egress rules."""
    if spec.get("policyTypes"):
        return spec["policyTypes"]
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


def _port_matches(entry: dict, dst: Pod, port: int, protocol: str) -> bool:
    """NetworkPolicyPort: protocol defaults to TCP; no port matches every port; a number
    (to endPort, inclusive) or a name of one of the destination pod's container ports."""
    if (entry.get("protocol") or "TCP") != protocol:
        return False
    if "port" not in entry or entry["port"] is None:
        return True
    want = entry["port"]
    if isinstance(want, str):
        return dst.ports.get(want) == port
    return want <= port <= entry.get("endPort", want)


def _peer_matches(peer: dict, policy_ns: str, src: Pod, namespaces: Mapping) -> bool:
    """NetworkPolicyPeer: podSelector alone, pods of the policy's namespace; namespaceSelector
    alone, every pod of the namespaces it selects; both, the pods matching podSelector in
    those namespaces (AND). Present but empty selects all."""
    if "ipBlock" in peer:
        raise NotImplementedError("ipBlock peers: pod IPs are not modelled")
    pods, spaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if pods is None and spaces is None:
        raise ValueError(f"peer {peer}: needs podSelector or namespaceSelector")
    if spaces is None:
        in_namespace = src.namespace == policy_ns
    else:
        in_namespace = selects(spaces, namespaces[src.namespace])
    return in_namespace and (pods is None or selects(pods, src.labels))


def ingress_allowed(
    policies: list[dict], namespaces: Mapping, src: Pod, dst: Pod, port: int, protocol="TCP"
) -> bool:
    """Whether a connection from src to dst:port is let in (NetworkPolicySpec.ingress):
    a pod no Ingress policy of its namespace selects takes everything; one that some do
    takes what at least one rule of one of them allows (they add up), a rule allowing a
    source matching one of its peers (none: any) on one of its ports (none: any). Traffic
    from the pod's own node (the kubelet's probes) always passes and is not modelled."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == dst.namespace
        and "Ingress" in _policy_types(p["spec"])
        and selects(p["spec"].get("podSelector") or {}, dst.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers, ports = rule.get("from") or [], rule.get("ports") or []
            ns = policy["metadata"]["namespace"]
            if peers and not any(_peer_matches(p, ns, src, namespaces) for p in peers):
                continue
            if ports and not any(_port_matches(e, dst, port, protocol) for e in ports):
                continue
            return True
    return False


# ------------------------------------------------------------- required pod affinity

HOSTNAME = "kubernetes.io/hostname"


def hostname_affinity_terms(pod_spec: dict) -> list[dict]:
    """The pod's requiredDuringSchedulingIgnoredDuringExecution podAffinity terms on the
    node's hostname (one node per term)."""
    affinity = (pod_spec.get("affinity") or {}).get("podAffinity") or {}
    terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    return [t for t in terms if t.get("topologyKey") == HOSTNAME]


def forced_onto_one_node(group: list[tuple[Pod, dict]], everyone: list[Pod]) -> list[str]:
    """Problems keeping the pods of `group` (Pod, pod spec) on one node. The scheduler
    (pkg/scheduler/framework/plugins/interpodaffinity/filtering.go satisfyPodAffinity)
    places a pod with a required affinity term only on a node whose hostname already runs
    a pod the term selects, except when no pod anywhere matches and the pod matches its
    own term: the first goes anywhere. So each pod needs a hostname term selecting, among
    `everyone`, exactly the group: itself (the first), all the others (they follow it),
    and no pod elsewhere they could follow instead."""
    names = {p.name for p, _ in group}
    problems = []
    for pod, spec in group:
        terms = hostname_affinity_terms(spec)
        if not terms:
            problems.append(f"{pod.name}: no required podAffinity on {HOSTNAME}")
        for term in terms:
            if "namespaceSelector" in term:
                raise NotImplementedError(f"{pod.name}: namespaceSelector in {term}")
            spaces = term.get("namespaces") or [pod.namespace]
            chosen = {
                p.name
                for p in everyone
                if p.namespace in spaces and selects(term.get("labelSelector"), p.labels)
            }
            if chosen != names:
                problems.append(f"{pod.name}: its {HOSTNAME} term selects {chosen}, not {names}")
    return problems
