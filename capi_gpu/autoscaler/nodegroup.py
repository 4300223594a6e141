"""A MachineDeployment as a node group: its autoscaler bounds, its owner, its price, and what one node of
it offers, read from the MachineDeployment and its HetznerGPUMachineTemplate. Pure: dicts in, values out.

Both the annotation writer and the claim-aware scaler need the same answers (which GPU model, which MIG
layout, how many GPUs per node); reading them in one place keeps the CA template node and the scaler's
picture of a node the same node. The layout is resolved exactly as the machine controller resolves it
(``gpu.gpuplan``), so a preset means what Ansible will apply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pydantic

from capi_gpu import domain
from capi_gpu.api.machine import HetznerGPUMachineTemplate
from capi_gpu.api.specs import MigMode
from capi_gpu.autoscaler import decide
from capi_gpu.gpu import catalog, gpuplan, packing

TEMPLATE_KIND = "HetznerGPUMachineTemplate"


class ScaleOwner(StrEnum):
    """Who may raise a MachineDeployment's replicas; exactly one per MachineDeployment."""

    CLAIM_SCALER = "claim-scaler"
    CLUSTER_AUTOSCALER = "cluster-autoscaler"


class NotAGroup(ValueError):
    """The MachineDeployment is not a GPU node group this package can describe; the message says why."""


@dataclass(frozen=True, slots=True)
class Bounds:
    min_size: int
    max_size: int


@dataclass(frozen=True, slots=True)
class NodeShape:
    """What one node of the group is: the GPU model, the resolved layout and the devices it offers."""

    model: catalog.GpuModel
    plan: gpuplan.GPUPlan
    gpus: int
    devices: tuple[tuple[str, int], ...]  # profile (or packing.WHOLE_GPU) -> count, for all GPUs of the node
    capacity: Mapping[str, str]  # the template's status.capacity (empty until a host was inspected)

    @property
    def mig(self) -> bool:
        return self.plan.layout is not None

    @property
    def layout_key(self) -> str:
        return self.plan.key


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    raw = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in raw.items()}


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    raw = (obj.get("metadata") or {}).get("annotations") or {}
    return {str(k): str(v) for k, v in raw.items()}


def bounds(md: Mapping[str, Any]) -> Bounds | None:
    """CA's min/max annotations, parsed as CA parses them; None when either is missing or invalid."""
    ann = annotations_of(md)
    try:
        low, high = int(ann[domain.CA_MIN_SIZE_ANNOTATION]), int(ann[domain.CA_MAX_SIZE_ANNOTATION])
    except (KeyError, ValueError):
        return None
    return Bounds(low, high) if 0 <= low <= high else None


def owner(md: Mapping[str, Any]) -> ScaleOwner | None:
    """The owner annotation; cluster-autoscaler when absent. None for a value this version doesn't know
    (nobody here acts on it: an unknown owner is never taken for ours), and None when the owner *label*
    says otherwise: the label is what cluster-autoscaler's discovery filter reads (docs/autoscaling.md
    §2), so a group annotated claim-scaler but labelled cluster-autoscaler is one CA manages, and the
    claim scaler must never raise it."""
    value = (annotations_of(md).get(domain.ANNOTATION_SCALER_OWNER) or ScaleOwner.CLUSTER_AUTOSCALER).strip()
    label = labels_of(md).get(domain.LABEL_SCALER_OWNER)
    if label is not None and label.strip() != value:
        return None
    try:
        return ScaleOwner(value)
    except ValueError:
        return None


def cost(md: Mapping[str, Any]) -> float | None:
    """The per-node cost annotation; None when absent or not a finite, non-negative number."""
    raw = annotations_of(md).get(domain.ANNOTATION_SCALE_COST)
    try:
        value = float(raw) if raw is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def replicas(md: Mapping[str, Any]) -> int:
    value = (md.get("spec") or {}).get("replicas")
    return int(value) if isinstance(value, int) else 0


def template_name(md: Mapping[str, Any]) -> str:
    """The HetznerGPUMachineTemplate the MachineDeployment clones from; NotAGroup for any other kind."""
    ref = ((((md.get("spec") or {}).get("template") or {}).get("spec") or {}).get("infrastructureRef")) or {}
    if ref.get("kind") != TEMPLATE_KIND or ref.get("apiGroup", domain.GROUP) != domain.GROUP or not ref.get("name"):
        raise NotAGroup(f"infrastructureRef is not a {TEMPLATE_KIND}")
    return str(ref["name"])


def node_shape(template: Mapping[str, Any], cat: catalog.Catalog | None = None) -> NodeShape:
    """One node of a template: NotAGroup when it has no GPU, uses Dynamic MIG, or its layout is invalid."""
    try:
        tpl = HetznerGPUMachineTemplate.model_validate(dict(template))
    except pydantic.ValidationError as exc:
        raise NotAGroup(f"template does not parse: {exc.errors()[0].get('msg')}") from exc
    gpu = tpl.spec.template.spec.gpu
    if gpu is None:
        raise NotAGroup("template has no spec.template.spec.gpu (not a GPU node)")
    if gpu.mig_mode is MigMode.DYNAMIC:
        raise NotAGroup("Dynamic MIG: the DRA driver makes instances per claim; no fixed layout to plan with")
    try:
        plan = gpuplan.plan(gpu, gpuplan.DEFAULT_MODEL, cat)
    except gpuplan.PlanError as exc:
        raise NotAGroup(str(exc)) from exc
    capacity = dict(tpl.status.capacity or {})
    try:
        gpus = max(1, int(capacity.get(domain.NVIDIA_GPU_RESOURCE, "1")))
    except ValueError:
        gpus = 1
    per_gpu = plan.layout.counts if plan.layout is not None else ((packing.WHOLE_GPU, 1),)
    return NodeShape(plan.model, plan, gpus, tuple((p, n * gpus) for p, n in per_gpu), capacity)


def group(
    md: Mapping[str, Any],
    shape: NodeShape,
    machines: Sequence[Mapping[str, Any]],
    gpu_nodes: set[str],
) -> decide.Group:
    """The decision's view of ``md``: ``machines`` are the cluster's CAPI Machines, ``gpu_nodes`` the nodes
    that publish NVIDIA devices. A replica counts as coming until its Machine's node publishes."""
    limits = bounds(md)
    if limits is None:
        raise NotAGroup("no valid cluster-autoscaler min/max annotations")
    name = str(md["metadata"]["name"])
    mine = [m for m in machines if labels_of(m).get(domain.CAPI_DEPLOYMENT_NAME_LABEL) == name]
    published = sum(1 for m in mine if ((m.get("status") or {}).get("nodeRef") or {}).get("name") in gpu_nodes)
    current = replicas(md)
    return decide.Group(
        name=name,
        model=shape.model,
        devices=shape.devices,
        replicas=current,
        min_size=limits.min_size,
        max_size=limits.max_size,
        owned=owner(md) is ScaleOwner.CLAIM_SCALER,
        cost=cost(md),
        coming=max(0, current - published),
    )
