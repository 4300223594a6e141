"""Whether a DaemonSet's pod would run on a node: the part of the DaemonSet controller's ``NodeShouldRunDaemonPod``
the simulated nodes need, as a pure function of the pod template's spec and the Node.

Why: no DaemonSet controller (and no container runtime) runs in the simulated clusters, so ``node_pods``
stands in for the NVIDIA chart's kubelet-plugin DaemonSet. It must place a plugin pod only where the real
controller would: the chart's required node affinity and our values' tolerations decide whether a GPU node
gets the plugin at all, and with it the driver's ResourceSlices that lift the readiness gate. A node the
DaemonSet does not fit never publishes, in the simulation as in a cluster.

Covered: ``nodeSelector``; required node affinity (``matchExpressions`` with In, NotIn, Exists, DoesNotExist,
Gt, Lt; ``matchFields`` on ``metadata.name``); NoSchedule/NoExecute taints against the template's
tolerations plus the ones the DaemonSet controller adds to every daemon pod; for a pod already running, only
NoExecute taints (``shouldContinueRunning``). Not covered (not used by the
charts we run): pod (anti-)affinity, host ports, resources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# What the DaemonSet controller adds to every daemon pod (pkg/controller/daemon/util.AddOrUpdateDaemonPodTolerations).
DAEMON_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


def misfit(pod_spec: Mapping[str, Any], node: Mapping[str, Any], *, running: bool = False) -> str | None:
    """None when the daemon pod runs on ``node``; otherwise why not (for logs and test messages). With
    ``running`` (its pod is already there) only NoExecute taints count: a NoSchedule taint added later (a
    cordon, cluster-autoscaler's ToBeDeleted) keeps new pods off but leaves the running one alone."""
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if terms is not None and not any(_term_matches(t, labels, str(meta.get("name", ""))) for t in terms):
        return "no required nodeAffinity term matches the node's labels"
    tolerations = [*(pod_spec.get("tolerations") or []), *DAEMON_TOLERATIONS]
    for taint in (node.get("spec") or {}).get("taints") or []:
        blocking = ("NoExecute",) if running else ("NoSchedule", "NoExecute")
        if taint.get("effect") in blocking and not any(_tolerates(t, taint) for t in tolerations):
            return f"taint {taint.get('key')}:{taint.get('effect')} is not tolerated"
    return None


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node (NodeSelectorTerm semantics)
    fields_ok = all(_requirement(f, {"metadata.name": name}) for f in fields)
    return fields_ok and all(_requirement(e, labels) for e in expressions)


def _requirement(req: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = req["key"], req["operator"]
    values: Sequence[str] = req.get("values") or []
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator", "Equal") == "Exists":
        return key == "" or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")
