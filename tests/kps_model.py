"""Which PodMonitors and PrometheusRules kube-prometheus-stack's Prometheus picks up.
The chart: prometheus-community/helm-charts at tag kube-prometheus-stack-88.5.3 (the
version docs/deploy.md pins), charts/kube-prometheus-stack/values.yaml and
templates/prometheus/prometheus.yaml. The selection: prometheus-operator at v0.93.0 (the
chart's appVersion is v0.93.1; v0.93.0 is the newest tag in the stored copy read),
pkg/prometheus/resource_selector.go selectObjects and pkg/operator/operator.go
SelectNamespacesFromCache, with the selector semantics of pkg/apis/monitoring/v1/
prometheus_types.go: an empty selector matches everything, a null one nothing (a null
namespace selector: the Prometheus' own namespace)."""

from __future__ import annotations

from collections.abc import Mapping

from k8s_rules import selects

KPS_CHART_VERSION = "88.5.3"
# values.yaml, prometheus.prometheusSpec, as the chart ships them
CHART_DEFAULTS = {
    "podMonitorSelector": {},
    "podMonitorSelectorNilUsesHelmValues": True,
    "podMonitorNamespaceSelector": {},
    "ruleSelector": {},
    "ruleSelectorNilUsesHelmValues": True,
    "ruleNamespaceSelector": {},
}


def _truthy(value) -> bool:
    """Go templates' `if`: nil, false, 0 and empty maps/lists/strings are false."""
    return bool(value)


def prometheus_spec(release: str, values: Mapping = CHART_DEFAULTS) -> dict:
    """The selectors templates/prometheus/prometheus.yaml writes into the Prometheus
    object: a non-empty selector value as given; else, with *NilUsesHelmValues (true by
    default), {matchLabels: {release: RELEASE}}; else {} (podMonitorSelector always; the
    ruleSelector only when not null). Namespace selectors: as given when non-empty,
    else {}."""
    spec: dict = {}
    for kind in ("podMonitor", "rule"):
        given = values.get(f"{kind}Selector")
        if _truthy(given):
            spec[f"{kind}Selector"] = given
        elif values.get(f"{kind}SelectorNilUsesHelmValues"):
            spec[f"{kind}Selector"] = {"matchLabels": {"release": release}}
        elif kind == "podMonitor" or given is not None:
            spec[f"{kind}Selector"] = {}
        namespaces = values.get(f"{kind}NamespaceSelector")
        spec[f"{kind}NamespaceSelector"] = namespaces if _truthy(namespaces) else {}
    return spec


def picked_up(
    obj: dict, prometheus: dict, prometheus_namespace: str, namespaces: Mapping[str, Mapping]
) -> bool:
    """Whether the Prometheus (its spec) selects a PodMonitor or PrometheusRule: the
    object's namespace among those its namespace selector admits (null: its own), and
    the object's labels matched by its selector (LabelSelectorAsSelector: null, none)."""
    kind = {"PodMonitor": "podMonitor", "PrometheusRule": "rule"}[obj["kind"]]
    where = obj["metadata"].get("namespace", "default")
    spaces = prometheus.get(f"{kind}NamespaceSelector")
    if spaces is None:
        admitted = where == prometheus_namespace
    else:
        admitted = selects(spaces, namespaces[where])
    labels = obj["metadata"].get("labels") or {}
    return admitted and selects(prometheus.get(f"{kind}Selector"), labels)
