"""Which workload Nodes the gate owns and what each must show: read from the management cluster.

A Node is ours when a HetznerGPUMachine of the cluster carries its providerID; what it must show comes
from the same GPU plan the Configure step applied (``gpuplan``), and the host side is what nvidia-smi
reported after the layout was applied (recorded in the host's status at provisioning).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from capi_gpu import domain
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.api.specs import MigMode
from capi_gpu.gpu import gpuplan, layout
from capi_gpu.kube import AsyncKube, Obj, ours
from capi_gpu.provisioning import move
from capi_gpu.readiness import decisions

MACHINES = ours("hetznergpumachines")
INFRA_CLUSTERS = ours("hetznergpuclusters")
HOSTS = ours("hetznergpuhosts")


@dataclass(frozen=True)
class GpuTarget:
    provider_id: str
    machine: str  # HetznerGPUMachine name
    capi_machine: str | None
    expected: decisions.ExpectedPool


def expected_pool(machine: HetznerGPUMachine, host: HetznerGPUHost | None) -> decisions.ExpectedPool | None:
    gpu = machine.spec.gpu
    if gpu is None or gpu.mig_mode is MigMode.DYNAMIC:
        return None  # no GPU stack, or the driver owns MIG: nothing to compare against
    model = next(
        (g.model for g in (host.status.hardware.gpus if host and host.status.hardware else []) if g.model), None
    )
    try:
        plan = gpuplan.plan(gpu, model or gpuplan.DEFAULT_MODEL)
    except gpuplan.PlanError:
        return None
    if plan.layout is None:
        return decisions.ExpectedPool(full_gpus=1)
    want = sorted(collections.Counter(plan.expected_profiles).elements())
    have = sorted(host.status.mig_devices) if host else []
    agrees = host is not None and have == want
    detail = "" if agrees else f"nvidia-smi on the host showed {have or 'nothing'}, the layout needs {want}"
    # The driver names MIG devices after the placement NVML actually chose and the GPU's minor, which need not
    # be what the plan predicts: the exact names come only from what the host's nvidia-smi reported at
    # provisioning (status.migInstances). Unknown (an older host, a relayout, an unreadable -lgi): counted by
    # profile. A predicted name never fails a node.
    profiles = collections.Counter(d.profile for d in plan.expected_devices())
    return decisions.ExpectedPool(
        profiles=dict(profiles), device_names=recorded_names(host, want), host_agrees=agrees, host_detail=detail
    )


def recorded_names(host: HetznerGPUHost | None, want: list[str]) -> frozenset[str] | None:
    """The DRA device names of the GPU instances the host reported, when they are all known and are the
    layout's profiles; else None."""
    instances = host.status.mig_instances if host else []
    if not instances or sorted(i.profile for i in instances) != want:
        return None
    names = set()
    for i in instances:
        if i.minor is None:
            return None
        names.add(layout.dra_device_name(i.minor, i.profile, i.profile_id, i.placement_start))
    return frozenset(names)


async def load(kube: AsyncKube, namespace: str, cluster: str) -> dict[str, GpuTarget]:
    """providerID -> target, for the cluster's provisioned GPU machines."""
    selector = f"{domain.CLUSTER_NAME_LABEL}={cluster}"
    machines = await kube.list(MACHINES, namespace, label_selector=selector)
    hosts = {h["metadata"]["name"]: h for h in await kube.list(HOSTS, namespace)}
    out: dict[str, GpuTarget] = {}
    for obj in machines:
        machine = HetznerGPUMachine.model_validate(obj)
        if not machine.spec.provider_id:
            continue
        host_obj: Obj | None = hosts.get(machine.status.host or "")
        if host_obj is not None and move.status_lost(host_obj.get("status")):
            # Moved here without status and not restored yet (clusterctl move; host_move.restore): nothing is
            # known of its GPU, so no verdict. Judged on it, the node of a running host would be tainted.
            continue
        host = HetznerGPUHost.model_validate(host_obj) if host_obj else None
        expected = expected_pool(machine, host)
        if expected is None:
            continue
        owner = next(
            (o["name"] for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == "Machine"), None
        )
        out[machine.spec.provider_id] = GpuTarget(machine.spec.provider_id, obj["metadata"]["name"], owner, expected)
    return out


NVIDIA_PLUGIN = "NVIDIA DRA kubelet plugin"
GATE_PLUGIN = decisions.PluginCheck("gate kubelet plugin", domain.GATE_PLUGIN_NAMESPACE, domain.GATE_PLUGIN_SELECTOR)


async def plugin_checks(kube: AsyncKube, namespace: str, infra_cluster: str) -> tuple[decisions.PluginCheck, ...]:
    """The kubelet plugins a GPU-ready node must run, as the HetznerGPUCluster names them: NVIDIA's (unless its
    selector is empty) and the gate's own (``config/dra/gate-plugin-daemonset.yaml``, always: without it no
    claim with a gate device can be prepared); none while the object is gone."""
    obj = await kube.get_or_none(INFRA_CLUSTERS, infra_cluster, namespace)
    if obj is None:
        return ()
    driver = HetznerGPUCluster.model_validate(obj).spec.addons.dra_driver
    if not driver.kubelet_plugin_selector:
        return (GATE_PLUGIN,)
    nvidia = decisions.PluginCheck(NVIDIA_PLUGIN, driver.kubelet_plugin_namespace, driver.kubelet_plugin_selector)
    return (nvidia, GATE_PLUGIN)
