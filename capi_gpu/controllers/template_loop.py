"""HetznerGPUMachineTemplate: scale-from-zero capacity and the warm standby pool.

Capacity is conservative, the minimum across the inspected hosts the template's hostSelector matches,
so cluster-autoscaler never builds a template node bigger than the smallest real one. The standby pool
keeps ``spec.standby.size`` matching hosts prepared (installed OS, driver, MIG layout) up to the join by
setting their ``spec.standby`` from the template; a claim then costs one bootstrap instead of a cold
install.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.host import HetznerGPUHost, HostStandby, HostState
from capi_gpu.api.machine import Architecture, HetznerGPUMachineTemplate, NodeInfo
from capi_gpu.controllers.host_context import HOSTS
from capi_gpu.gpu import gpuplan
from capi_gpu.kube import Conflict, ours
from capi_gpu.runtime import events, loops, metrics, pause
from capi_gpu.runtime.deps import Deps

TEMPLATES = ours("hetznergpumachinetemplates")


def _matching(tpl: HetznerGPUMachineTemplate, hosts: list[HetznerGPUHost]) -> list[HetznerGPUHost]:
    spec = tpl.spec.template.spec
    want = (spec.gpu.model or gpuplan.DEFAULT_MODEL) if spec.gpu is not None else None
    out = []
    for h in hosts:
        raw: Any = h.metadata.get("labels") or {}
        labels = {str(k): str(v) for k, v in raw.items()}
        if h.spec.retired or not spec.host_selector.matches(labels):
            continue
        if want is not None and want not in {g.model for g in (h.status.hardware.gpus if h.status.hardware else [])}:
            continue
        out.append(h)
    return out


def capacity(hosts: list[HetznerGPUHost]) -> dict[str, str] | None:
    """The smallest matching host, as a ResourceList; None when none is inspected yet."""
    hw = [h.status.hardware for h in hosts if h.status.hardware is not None]
    if not hw:
        return None
    cpu = min(x.cpu_threads for x in hw)
    mem = min(x.memory_mib for x in hw)
    disk = min(min((d.size_bytes for d in x.disks), default=0) for x in hw)
    gpus = min(len(x.gpus) for x in hw)
    return {
        "cpu": str(cpu),
        "memory": f"{mem}Mi",
        "ephemeral-storage": f"{disk // (1024**3)}Gi",
        "nvidia.com/gpu": str(gpus),
    }


def standby_changes(
    tpl_name: str, tpl: HetznerGPUMachineTemplate, hosts: list[HetznerGPUHost]
) -> tuple[list[HetznerGPUHost], list[HetznerGPUHost]]:
    """(hosts to put on standby, hosts to take off), pure."""
    size = tpl.spec.standby.size if tpl.spec.standby else 0
    mine = [
        h
        for h in hosts
        if h.spec.standby is not None and h.spec.standby.template == tpl_name and h.spec.consumer_ref is None
    ]
    free = [
        h
        for h in hosts
        if h.spec.standby is None
        and h.spec.consumer_ref is None
        and not h.spec.maintenance_mode
        and h.status.state is HostState.AVAILABLE
    ]
    if len(mine) < size:
        return sorted(free, key=lambda h: h.spec.server_number)[: size - len(mine)], []
    # Too many: release the least prepared first.
    rank = {HostState.STANDBY: 2, HostState.STANDBY_PREPARING: 1}
    extra = sorted(mine, key=lambda h: (rank.get(h.status.state, 0), h.spec.server_number))[: len(mine) - size]
    return [], extra


def unlabelled_standby(
    tpl_name: str, cluster: str | None, hosts: list[HetznerGPUHost], leaving: list[HetznerGPUHost]
) -> list[HetznerGPUHost]:
    """This pool's unclaimed hosts whose cluster label doesn't name the template's Cluster, pure."""
    gone = {h.spec.server_number for h in leaving}
    out = []
    for h in hosts:
        if h.spec.standby is None or h.spec.standby.template != tpl_name or h.spec.consumer_ref is not None:
            continue
        raw: Any = h.metadata.get("labels") or {}
        if cluster and h.spec.server_number not in gone and raw.get(domain.CONSUMER_CLUSTER_LABEL) != cluster:
            out.append(h)
    return out


async def reconcile(deps: Deps, namespace: str, name: str) -> float | None:
    obj = await deps.kube.get_or_none(TEMPLATES, name, namespace)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    tpl = HetznerGPUMachineTemplate.model_validate(obj)
    now, gen = deps.clock(), obj["metadata"].get("generation")
    if await pause.paused(deps, namespace, obj):  # CAPI makes the Cluster own the templates it uses
        await _write_paused(deps, tpl, namespace, name, now, gen)
        return 30.0
    hosts = _matching(tpl, [HetznerGPUHost.model_validate(h) for h in await deps.kube.list(HOSTS, namespace)])
    add, remove = standby_changes(name, tpl, hosts)
    spec = tpl.spec.template.spec
    standby = HostStandby(
        install_image=spec.install_image,
        gpu=spec.gpu or HostStandby().gpu,
        kubernetes_version=spec.kubernetes_version or "v1.36.3",
        template=name,
    )
    # A standby host pauses with the template's Cluster (clusterctl move): the label names it.
    cluster = pause.cluster_name(obj)
    labels = {domain.CONSUMER_CLUSTER_LABEL: cluster} if cluster else {}
    for h in add:
        meta = {"resourceVersion": h.metadata["resourceVersion"], "labels": labels}
        await deps.kube.patch(
            HOSTS, str(h.metadata["name"]), {"metadata": meta, "spec": {"standby": standby.wire()}}, namespace
        )
        deps.wakeups.wake("host", namespace, str(h.metadata["name"]))
        events.emit(obj, "StandbyAdded", f"{h.metadata['name']} joins the standby pool")
    for h in remove:
        body = {"metadata": {"labels": {domain.CONSUMER_CLUSTER_LABEL: None}}, "spec": {"standby": None}}
        await deps.kube.patch(HOSTS, str(h.metadata["name"]), body, namespace)
        deps.wakeups.wake("host", namespace, str(h.metadata["name"]))
        events.emit(obj, "StandbyRemoved", f"{h.metadata['name']} leaves the standby pool")
    for h in unlabelled_standby(name, cluster, hosts, remove):  # set before the label existed, or released
        meta = {"resourceVersion": h.metadata["resourceVersion"], "labels": labels}
        # A host being prepared is written often: a conflict waits for the next pass, not the status below.
        with contextlib.suppress(Conflict):
            await deps.kube.patch(HOSTS, str(h.metadata["name"]), {"metadata": meta}, namespace)
    status = tpl.status.model_copy(deep=True)
    status.conditions = pause.condition(status.conditions, False, now, gen)
    cap = capacity(hosts)
    status.capacity, status.matching_hosts = cap, len(hosts)
    status.node_info = NodeInfo(architecture=Architecture.AMD64, operating_system="linux")
    ready_standby = sum(
        1
        for h in hosts
        if h.status.state is HostState.STANDBY and h.spec.standby is not None and h.spec.standby.template == name
    )
    status.standby_hosts = ready_standby
    metrics.STANDBY_HOSTS.labels(template=f"{namespace}/{name}").set(ready_standby)
    status.conditions = c.set_condition(
        status.conditions,
        c.Type.CAPACITY_KNOWN,
        cap is not None,
        c.Reason.CAPACITY_FROM_HOSTS if cap else c.Reason.NO_HOSTS,
        f"minimum of {len(hosts)} matching hosts" if cap else "no inspected host matches the hostSelector",
        now,
        gen,
    )
    size = tpl.spec.standby.size if tpl.spec.standby else 0
    status.conditions = c.set_condition(
        status.conditions,
        c.Type.STANDBY_POOL_READY,
        ready_standby >= size,
        c.Reason.READY if ready_standby >= size else c.Reason.STANDBY_SHORT,
        f"{ready_standby}/{size} standby hosts prepared",
        now,
        gen,
    )
    if status.model_dump() != tpl.status.model_dump():
        await deps.kube.patch(
            TEMPLATES, name, {"status": status.model_dump(by_alias=True, mode="json")}, namespace, sub="status"
        )
    return 30.0


async def _write_paused(
    deps: Deps, tpl: HetznerGPUMachineTemplate, namespace: str, name: str, now: datetime, gen: int | None
) -> None:
    conds = pause.condition(tpl.status.conditions, True, now, gen)
    if [x.model_dump() for x in conds] != [x.model_dump() for x in tpl.status.conditions]:
        body = {"conditions": [x.wire() for x in conds]}
        await deps.kube.patch(TEMPLATES, name, {"status": body}, namespace, sub="status")


async def run(deps: Deps, namespace: str, name: str, stopped: Any) -> None:
    await loops.run("template", reconcile, deps, namespace, name, stopped)
