"""The cluster-autoscaler annotations a GPU MachineDeployment needs for scale from zero, computed from its
HetznerGPUMachineTemplate (``status.capacity``, the MIG layout). Pure: dicts in, a desired set and a
merge patch out; ``capi-gpu autoscaler annotate`` and the ``--sync-autoscaler-annotations`` loop write it.

Why annotations when the template's ``status.capacity`` already feeds CA: annotations win over the
template (CA's rule), and only annotations carry labels, taints and the DRA driver. What is written:

* ``cpu``, ``memory``, ``ephemeral-disk`` from ``status.capacity`` (the smallest matching host), and
  ``maxPods`` (110 unless told);
* the GPU, for a whole-GPU node only. Two forms, one per MachineDeployment:

  - ``dra-driver: gpu.nvidia.com`` + ``gpu-count`` (default): CA synthesises one ResourceSlice per
    template node with devices ``gpu-0..N`` whose only attribute is ``type: gpu``. Claims of NVIDIA's
    ``gpu.nvidia.com`` class match it; claims selecting anything else (a MIG ``profile``, ``productName``,
    memory) or also asking for our gate device never do (kubernetes/autoscaler#10199);
  - ``gpu-type: nvidia.com/gpu`` + ``gpu-count``: the device-plugin form; only pods that request the
    ``nvidia.com/gpu`` extended resource fit the template node.

  A node with a MIG layout gets neither: the synthetic slice would promise whole GPUs the node does not
  offer, so CA could add a MIG node for a whole-GPU claim it can never serve. MIG claims are the
  claim-aware scaler's (``capi_gpu.autoscaler.scaler``);
* ``labels``: our GPU label and our MIG layout label. Never ``cluster-api/accelerator`` (CA's clusterapi
  GPU label): CA 1.36 counts a ready node with that label and no ``nvidia.com/gpu`` allocatable as one
  whose GPU is not up yet (``processors/customresources/gpu_processor.go``), and a DRA node never has that
  allocatable, so every GPU-ready node looked unready and CA never scaled. An old entry is removed; our
  startup taint already tells CA a new node is still coming up;
* ``taints``: the startup taint ``readiness.k8s.io/gpu-not-ready:NoSchedule``, which CA strips from the
  template node when run with ``--startup-taint-prefix=readiness.k8s.io/`` (and which, without that
  flag, keeps CA from scaling for pods that don't tolerate it: a visible misconfiguration, not a silent one).

Entries of ``labels`` and ``taints`` that someone else added are kept; only ours are set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from capi_gpu import domain
from capi_gpu.autoscaler.nodegroup import NodeShape, ScaleOwner, annotations_of, labels_of

DEFAULT_MAX_PODS = 110
STARTUP_TAINT = f"{domain.NODE_STARTUP_TAINT}:NoSchedule"
GPU_KEYS = (domain.CA_CAPACITY_DRA_DRIVER, domain.CA_CAPACITY_GPU_TYPE, domain.CA_CAPACITY_GPU_COUNT)


class GpuResource(StrEnum):
    """How the template node advertises its GPU to cluster-autoscaler."""

    DRA = "dra"
    DEVICE_PLUGIN = "device-plugin"


class Incomplete(ValueError):
    """The template does not say enough yet (no inspected host gave it a capacity)."""


@dataclass(frozen=True)
class Desired:
    """What the MachineDeployment should carry; an annotation set to None is removed."""

    annotations: dict[str, str | None]
    labels: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def present(self) -> dict[str, str]:
        return {k: v for k, v in self.annotations.items() if v is not None}


def gpu_resource_of(md: Mapping[str, Any]) -> GpuResource:
    """The form a MachineDeployment already uses: device-plugin when it carries gpu-type, else DRA."""
    return GpuResource.DEVICE_PLUGIN if domain.CA_CAPACITY_GPU_TYPE in annotations_of(md) else GpuResource.DRA


def desired(
    md: Mapping[str, Any],
    shape: NodeShape,
    *,
    gpu_resource: GpuResource = GpuResource.DRA,
    max_pods: int = DEFAULT_MAX_PODS,
    owner: ScaleOwner | None = None,
) -> Desired:
    """The annotations (and owner label) for ``md`` whose nodes look like ``shape``."""
    cap = shape.capacity
    if not cap.get("cpu") or not cap.get("memory"):
        raise Incomplete("the template's status.capacity has no cpu/memory yet (no inspected host matches it)")
    current = annotations_of(md)
    ann: dict[str, str | None] = {
        domain.CA_CAPACITY_CPU: cap["cpu"],
        domain.CA_CAPACITY_MEMORY: cap["memory"],
        domain.CA_CAPACITY_EPHEMERAL_DISK: cap.get("ephemeral-storage"),
        domain.CA_CAPACITY_MAX_PODS: str(max_pods),
    }
    ann.update(_gpu(shape, gpu_resource))
    notes: list[str] = []
    if shape.mig:
        notes.append(
            f"MIG layout {shape.layout_key}: no dra-driver/gpu-type; CA's synthetic slice can only say type=gpu "
            "(kubernetes/autoscaler#10199), a device this node does not offer. The claim-aware scaler covers MIG."
        )
    ours = {domain.LABEL_GPU_PRESENT: "true", domain.LABEL_LAYOUT: shape.layout_key}
    theirs = _parse_labels(current.get(domain.CA_CAPACITY_LABELS))
    theirs.pop(domain.CA_ACCELERATOR_LABEL, None)
    ann[domain.CA_CAPACITY_LABELS] = _join_labels({**theirs, **ours})
    ann[domain.CA_CAPACITY_TAINTS] = _with_taint(current.get(domain.CA_CAPACITY_TAINTS), STARTUP_TAINT)
    labels: dict[str, str] = {}
    if owner is not None:
        ann[domain.ANNOTATION_SCALER_OWNER] = owner.value
        labels[domain.LABEL_SCALER_OWNER] = owner.value
    return Desired(ann, labels, tuple(notes))


def merge_patch(md: Mapping[str, Any], want: Desired) -> dict[str, Any] | None:
    """The merge patch that brings ``md`` to ``want``; None when it already matches.

    The owner label also goes into the Machine template: CA 1.36.1 applies its discovery label filter to
    every Machine and MachineSet it looks up, so a group whose Machines lack the label has no nodes in
    CA's eyes and is never scaled ("not ready for scaleup - unhealthy"). CAPI copies template labels to
    MachineSets and Machines in place, without a rollout.
    """
    current = annotations_of(md)
    labels = labels_of(md)
    ann = {k: v for k, v in want.annotations.items() if current.get(k) != v and not (v is None and k not in current)}
    lab = {k: v for k, v in want.labels.items() if labels.get(k) != v}
    spec = md.get("spec") or {}
    template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    tlab = {k: v for k, v in want.labels.items() if template_labels.get(k) != v}
    patch: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    if ann:
        meta["annotations"] = ann
    if lab:
        meta["labels"] = lab
    if meta:
        patch["metadata"] = meta
    if tlab:
        patch["spec"] = {"template": {"metadata": {"labels": tlab}}}
    return patch or None


def _gpu(shape: NodeShape, form: GpuResource) -> dict[str, str | None]:
    if shape.mig:
        return dict.fromkeys(GPU_KEYS)
    count = str(shape.gpus)
    if form is GpuResource.DRA:
        return {
            domain.CA_CAPACITY_DRA_DRIVER: domain.NVIDIA_DRIVER,
            domain.CA_CAPACITY_GPU_COUNT: count,
            domain.CA_CAPACITY_GPU_TYPE: None,
        }
    return {
        domain.CA_CAPACITY_GPU_TYPE: domain.NVIDIA_GPU_RESOURCE,
        domain.CA_CAPACITY_GPU_COUNT: count,
        domain.CA_CAPACITY_DRA_DRIVER: None,
    }


def _parse_labels(raw: str | None) -> dict[str, str]:
    """CA's ``k=v,k2=v2`` (entries without ``=`` are dropped, as CA drops them)."""
    out: dict[str, str] = {}
    for item in (raw or "").split(","):
        key, sep, value = item.strip().partition("=")
        if sep and key:
            out[key] = value
    return out


def _join_labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _with_taint(raw: str | None, taint: str) -> str:
    """CA's ``key[=value]:Effect,...`` with ``taint`` in it once; other entries kept in their order."""
    key = taint.split(":", 1)[0].split("=", 1)[0]
    kept = [t.strip() for t in (raw or "").split(",") if t.strip()]
    return ",".join([*(t for t in kept if t.split(":", 1)[0].split("=", 1)[0] != key), taint])
