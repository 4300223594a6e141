"""``--sync-autoscaler-annotations``: keep the cluster-autoscaler annotations of GPU MachineDeployments in
step with their HetznerGPUMachineTemplate, as ``capi-gpu autoscaler annotate`` writes them once.

The loop is keyed on the template, not on the MachineDeployment: one kopf daemon per
HetznerGPUMachineTemplate (our kind, which already carries our finalizer), woken by MachineDeployment
events, reconciles every autoscaled MachineDeployment that clones from it. A daemon on
MachineDeployments would have made kopf put its finalizer on CAPI's objects, which would then block
their deletion whenever the operator is down. The capacity comes from the template's ``status.capacity``,
which the template controller refreshes every 30 s; a resync every minute carries it over.

The loop owns the capacity keys it writes (a hand-edited ``cpu`` is put back); extra entries in the
``labels``/``taints`` annotations are kept. It never writes the owner annotation: who scales a
MachineDeployment is a human's decision (``capi-gpu autoscaler annotate --owner``). The GPU form in use
(``dra-driver`` or ``gpu-type``) is kept, DRA for a MachineDeployment that has neither. A paused
MachineDeployment or Cluster (``runtime.pause``, asked right before the write) is left alone, so the source
of a clusterctl move is never written; the resync after the resume catches up.
"""

from __future__ import annotations

import logging
from typing import Any

from capi_gpu.autoscaler import annotations as ca_annotations
from capi_gpu.autoscaler import nodegroup
from capi_gpu.kube import CAPI_CLUSTERS, CAPI_MACHINEDEPLOYMENTS, Obj, ours
from capi_gpu.runtime import events, loops, pause
from capi_gpu.runtime.deps import Deps

log = logging.getLogger(__name__)
TEMPLATES = ours("hetznergpumachinetemplates")
KIND = "autoscaler-annotations"  # the wake-up key: (KIND, namespace, template name)
RESYNC = 60.0
NOT_A_GPU_TEMPLATE_RESYNC = 600.0


async def reconcile(deps: Deps, namespace: str, name: str) -> float | None:
    template = await deps.kube.get_or_none(TEMPLATES, name, namespace)
    if template is None or template["metadata"].get("deletionTimestamp"):
        return None
    try:
        shape = nodegroup.node_shape(template)
    except nodegroup.NotAGroup:
        return NOT_A_GPU_TEMPLATE_RESYNC  # a control-plane template, or a layout the machine controller refuses
    clusters: dict[str, Obj | None] = {}  # read once per pass, and only when a write is due
    for md in await deps.kube.list(CAPI_MACHINEDEPLOYMENTS, namespace):
        if not _clones_from(md, name) or nodegroup.bounds(md) is None:
            continue
        try:
            want = ca_annotations.desired(md, shape, gpu_resource=ca_annotations.gpu_resource_of(md))
        except ca_annotations.Incomplete as exc:
            log.info("autoscaler annotations %s/%s: %s", namespace, md["metadata"]["name"], exc)
            continue
        patch = ca_annotations.merge_patch(md, want)
        if patch is None or await _paused(deps, namespace, md, clusters):
            continue
        await deps.kube.patch(CAPI_MACHINEDEPLOYMENTS, md["metadata"]["name"], patch, namespace)
        changed = ", ".join(sorted(k.rsplit("/", 1)[-1] for k in patch.get("metadata", {}).get("annotations", {})))
        events.emit(md, "AutoscalerAnnotationsSynced", f"from {nodegroup.TEMPLATE_KIND} {name}: {changed}")
    return RESYNC


async def _paused(deps: Deps, namespace: str, md: Obj, clusters: dict[str, Obj | None]) -> bool:
    name = str((md.get("spec") or {}).get("clusterName") or "")
    if name and name not in clusters:
        clusters[name] = await deps.kube.get_or_none(CAPI_CLUSTERS, name, namespace)
    if pause.is_paused(clusters.get(name), md):
        log.info("autoscaler annotations %s/%s: paused; not written", namespace, md["metadata"]["name"])
        return True
    return False


def _clones_from(md: dict[str, Any], template: str) -> bool:
    try:
        return nodegroup.template_name(md) == template
    except nodegroup.NotAGroup:
        return False


def template_of(spec: Any) -> str | None:
    """The template a MachineDeployment spec clones from, if it is ours (for the wake-up handler)."""
    try:
        return nodegroup.template_name({"spec": dict(spec)})
    except nodegroup.NotAGroup:
        return None


async def run(deps: Deps, namespace: str, name: str, stopped: Any) -> None:
    await loops.run(KIND, reconcile, deps, namespace, name, stopped)
