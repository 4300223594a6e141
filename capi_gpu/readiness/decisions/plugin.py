"""Are a node's DRA kubelet plugins running? Decided from their pods.

The slices alone can't say: the kubelet keeps a departed plugin's ResourceSlices for 30 s (so a restarting
plugin need not republish), and kube-scheduler allocates from them meanwhile. A node whose plugin is gone
for good would look GPU-ready for that long, and a pod placed there fails at NodePrepareResources. So a
GPU-ready node also needs one of the driver's kubelet-plugin pods bound to it, Running and Ready (the
chart's containers have startup and liveness probes, no readiness probe: Ready means started and alive).
The gate driver's own kubelet plugin is needed as much: the kubelet prepares every driver a claim names,
and a claim on a GPU node names the gate device too, so without it no GPU pod starts there.

Pure: the pods the caller watched (by ``PluginCheck.selector``) in, a problem message or None out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from capi_gpu.unstructured import as_map


@dataclasses.dataclass(frozen=True)
class PluginCheck:
    """Which pods are a driver's kubelet plugin: a label selector, in one namespace or ("") any."""

    name: str  # for messages: "NVIDIA DRA kubelet plugin"
    namespace: str
    selector: str


def plugin_problem(pods: Iterable[Mapping[str, Any]], node_name: str, check: PluginCheck) -> str | None:
    """None when a plugin pod runs on ``node_name``; otherwise what is wrong, for the condition's message."""
    seen: list[str] = []
    for pod in pods:
        meta, spec = as_map(pod.get("metadata")), as_map(pod.get("spec"))
        if spec.get("nodeName") != node_name or (check.namespace and meta.get("namespace") != check.namespace):
            continue
        status = as_map(pod.get("status"))
        phase = str(status.get("phase") or "Pending")
        ready = any(
            as_map(c).get("type") == "Ready" and as_map(c).get("status") == "True"
            for c in status.get("conditions") or []
        )
        if not meta.get("deletionTimestamp") and phase == "Running" and ready:
            return None
        state = "terminating" if meta.get("deletionTimestamp") else phase if phase != "Running" else "not Ready"
        seen.append(f"{meta.get('namespace')}/{meta.get('name')} {state}")
    where = f"in namespace {check.namespace}" if check.namespace else "in any namespace"
    found = f": {', '.join(sorted(seen))}" if seen else ""
    return f"no {check.name} pod ({check.selector} {where}) Running and Ready on node {node_name}{found}"
