"""The DaemonSet controller's rolling update and status, for the DaemonSet the simulator plays the controller of
(the NVIDIA chart's kubelet plugin, ``node_pods``). Pure: ``node_pods`` reads the objects and writes the result.

Why: no DaemonSet controller runs in the simulated clusters, so without this a changed pod template (a chart
upgrade, a values change, ``kubectl rollout restart``) restarted no plugin at all, and the chart's
``updateStrategy.rollingUpdate.maxUnavailable`` (ours: HetznerGPUCluster
``spec.addons.draDriver.pluginMaxUnavailable``) could not be seen to act. What kube-controller-manager does
(``pkg/controller/daemon/update.go``, ``rollingUpdate`` with ``maxSurge`` 0, the chart's):

- a pod is up to date when its ``controller-revision-hash`` label is the current template's; a node whose
  only pod is terminating, or has none, counts as unavailable; so does an up-to-date pod not yet Ready;
- an old pod that is not available is replaced at once; old available pods are deleted only while the
  unavailable count stays within ``maxUnavailable`` (a percentage of the desired nodes, rounded up; 0 with
  no surge means 1); the replacement is created once the old pod's deletion was confirmed;
- ``OnDelete``: nothing is deleted, a pod changes only when someone deletes it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REVISION_LABEL = "controller-revision-hash"


def template_hash(daemonset: Mapping[str, Any]) -> str:
    """Stands in for the ControllerRevision's hash: changes exactly when the pod template does."""
    template = json.dumps(daemonset["spec"]["template"], sort_keys=True).encode()
    return hashlib.sha256(template).hexdigest()[:10]


def max_unavailable(daemonset: Mapping[str, Any], desired: int) -> int:
    """``rollingUpdate.maxUnavailable`` against ``desired`` nodes (the apiserver defaults it to 1)."""
    strategy = daemonset["spec"].get("updateStrategy") or {}
    value = (strategy.get("rollingUpdate") or {}).get("maxUnavailable", 1)
    percent = isinstance(value, str) and value.endswith("%")
    count = math.ceil(int(str(value)[:-1]) * desired / 100) if percent else int(value)
    return 1 if desired > 0 and count == 0 else count


@dataclass(frozen=True)
class NodePod:
    """The one non-terminating daemon pod on a node."""

    name: str
    updated: bool
    available: bool


def to_delete(daemonset: Mapping[str, Any], pods: Mapping[str, NodePod | None]) -> list[str]:
    """The old pods to delete now. ``pods``: every node the DaemonSet should run on, with its pod or None."""
    if (daemonset["spec"].get("updateStrategy") or {}).get("type", "RollingUpdate") != "RollingUpdate":
        return []
    limit = max_unavailable(daemonset, len(pods))
    unavailable = 0
    replace: list[str] = []
    candidates: list[str] = []
    for node in sorted(pods):
        pod = pods[node]
        if pod is None or (pod.updated and not pod.available):
            unavailable += 1
        elif pod.updated:
            continue
        elif not pod.available:
            replace.append(pod.name)
        elif unavailable < limit:
            candidates.append(pod.name)
    return replace + candidates[: max(0, limit - unavailable)]


def status(daemonset: Mapping[str, Any], pods: Mapping[str, NodePod | None]) -> dict[str, Any]:
    """The DaemonSet's status as the controller writes it (``minReadySeconds`` 0: Ready is available)."""
    present = [p for p in pods.values() if p is not None]
    available = sum(1 for p in present if p.available)
    return {
        "observedGeneration": daemonset["metadata"].get("generation"),
        "desiredNumberScheduled": len(pods),
        "currentNumberScheduled": len(present),
        "numberMisscheduled": 0,
        "numberReady": available,
        "numberAvailable": available,
        "numberUnavailable": len(pods) - available,
        "updatedNumberScheduled": sum(1 for p in present if p.updated),
    }
