"""What the validating webhook refuses beyond the CRDs' CEL rules: what needs the GPU catalog (MIG
placement, engine budgets, the driver branch), other objects (one HetznerGPUHost per Robot server; one
cluster creating a VLAN, disjoint address ranges on a shared vSwitch), address arithmetic (a private
network's range inside its subnet) or the operator's flags (the registries a cluster's chartRef may name).

The decisions are the controllers' own (``gpuplan.plan``, the same message and reason a LayoutValid
condition carries, with the nearest valid layouts), so a refusal at ``kubectl apply`` and the condition
on an object created while the webhook was down read alike. Pure: the handler passes the object and
the hosts it listed. A baked node image (``spec.image``) is the schema's alone here: its manifest, which
says what the image fits, is inside the archive, so the Install step checks it in rescue (``node_image``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from capi_gpu.api.cluster import Addons, HetznerGPUCluster, HetznerGPUClusterTemplate
from capi_gpu.api.conditions import Reason
from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.api.machine import HetznerGPUMachine, HetznerGPUMachineTemplate
from capi_gpu.api.specs import GPUSpec
from capi_gpu.gpu import catalog, gpuplan
from capi_gpu.provisioning import chartref, private_network


@dataclass(frozen=True)
class Refusal:
    """Why an object is refused: the field, the condition reason a controller would set, the message."""

    field: str
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}: {self.message}"


def gpu_refusals(gpu: GPUSpec | None, field: str, inspected: str | None, cat: catalog.Catalog) -> list[Refusal]:
    """The machine controller's layout check (``plan`` with the model it would use: the spec's, else the
    inspected one, else the default GEX131 GPU)."""
    if gpu is None:
        return []
    try:
        gpuplan.plan(gpu, inspected or gpuplan.DEFAULT_MODEL, cat)
    except gpuplan.PlanError as exc:
        where = f"{field}.model" if exc.reason is Reason.UNKNOWN_GPU_MODEL else f"{field}.layout"
        if exc.reason is Reason.DRIVER_TOO_OLD:
            where = f"{field}.driverBranch"
        return [Refusal(where, exc.reason.value, str(exc))]
    return []


def _age(meta: Mapping[str, Any]) -> tuple[str, str, str]:
    # RFC 3339 timestamps in UTC sort as strings; namespace/name break a tie (a new object has none yet).
    return (str(meta.get("creationTimestamp") or "~"), str(meta.get("namespace")), str(meta.get("name")))


def duplicate_server(host: HetznerGPUHost, others: Iterable[Mapping[str, Any]]) -> Refusal | None:
    """Another, older HetznerGPUHost (any namespace) for the same Robot server: two would reset and install
    one machine from two state machines. Only the younger of two is refused, by the webhook and by the host
    controller alike: two written while the webhook was down are both stored, the controller holds the
    younger, and the older one, already working on the server, must keep taking its patches (claim,
    release, standby, retire). A new object has no creationTimestamp yet, so it is always the younger."""
    meta = host.metadata
    for other in others:
        om = other.get("metadata") or {}
        same = om.get("namespace") == meta.get("namespace") and om.get("name") == meta.get("name")
        if same or (other.get("spec") or {}).get("serverNumber") != host.spec.server_number:
            continue
        if _age(om) > _age(meta):
            continue
        return Refusal(
            "spec.serverNumber",
            Reason.DUPLICATE_SERVER.value,
            f"server {host.spec.server_number} already has HetznerGPUHost {om.get('namespace')}/{om.get('name')}: "
            "one HetznerGPUHost per Robot server; use that one, or delete it first",
        )
    return None


def chart_refusals(addons: Addons, field: str, charts: chartref.Policy) -> list[Refusal]:
    """A chartRef outside the operator's allow-list (``chartref``): helm would fetch it as the operator."""
    why = chartref.refusal(addons.dra_driver.chart_ref, charts)
    return [Refusal(f"{field}.draDriver.chartRef", Reason.CHART_REF_NOT_ALLOWED.value, why)] if why else []


def network_refusals(
    cluster: HetznerGPUCluster, body: Mapping[str, Any], clusters: Iterable[Mapping[str, Any]]
) -> list[Refusal]:
    """Another cluster would create the same VLAN, or hand out the same addresses on the same vSwitch. The
    spec's own rules (range inside the subnet, gateway spared) are the model's, checked by validation."""
    spec = cluster.spec.private_network
    if spec is None:
        return []
    found = private_network.cluster_conflicts(spec, body, clusters)
    return [Refusal("spec.privateNetwork", Reason.PRIVATE_NETWORK_CONFLICT.value, why) for why in found]


def refusals(
    kind: str,
    body: Mapping[str, Any],
    hosts: Iterable[Mapping[str, Any]],
    cat: catalog.Catalog,
    charts: chartref.Policy = chartref.DEFAULT_POLICY,
) -> list[Refusal]:
    """Everything wrong with ``body`` (one of our kinds) that the schema and CEL can't see. ``hosts`` are the
    other objects of the kind the check needs: every HetznerGPUHost for a host, every HetznerGPUCluster for a
    cluster (its private network against theirs)."""
    try:
        if kind == "HetznerGPUCluster":
            c = HetznerGPUCluster.model_validate({**body, "status": {}})
            return [*chart_refusals(c.spec.addons, "spec.addons", charts), *network_refusals(c, body, hosts)]
        if kind == "HetznerGPUClusterTemplate":
            ct = HetznerGPUClusterTemplate.model_validate(body)
            return chart_refusals(ct.spec.template.spec.addons, "spec.template.spec.addons", charts)
        if kind == "HetznerGPUMachine":
            m = HetznerGPUMachine.model_validate(body)
            return gpu_refusals(m.spec.gpu, "spec.gpu", None, cat)
        if kind == "HetznerGPUMachineTemplate":
            t = HetznerGPUMachineTemplate.model_validate(body)
            return gpu_refusals(t.spec.template.spec.gpu, "spec.template.spec.gpu", None, cat)
        if kind == "HetznerGPUHost":
            h = HetznerGPUHost.model_validate({**body, "status": {}})  # status is the controller's, not checked
            found = (
                gpu_refusals(h.spec.standby.gpu, "spec.standby.gpu", _inspected(body), cat) if h.spec.standby else []
            )
            dup = duplicate_server(h, hosts)
            return [*found, *([dup] if dup else [])]
    except ValidationError as exc:  # the schema admitted it, so this is our model being stricter
        first = exc.errors(include_url=False)[0]
        return [Refusal(".".join(map(str, first["loc"])), "Invalid", first["msg"])]
    return []


def _inspected(body: Mapping[str, Any]) -> str | None:
    gpus = ((body.get("status") or {}).get("hardware") or {}).get("gpus") or []
    return next((str(g["model"]) for g in gpus if g.get("model")), None)
