"""What the cluster-autoscaler e2e reads and drives: workloads CA may drain, CA's own view, the figures.

Each workload is a one-replica ReplicaSet: CA drains only pods a controller recreates, and one ReplicaSet
per pod lets a test empty exactly the node it means to (deleting a ReplicaSet deletes its one pod).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from flow_kit import MD_NAME, gpu_nodes, ns, pod_claim, wait

from capi_gpu import domain
from capi_gpu.kube import (
    CAPI_MACHINEDEPLOYMENTS,
    CAPI_MACHINES,
    CAPI_MACHINESETS,
    NODES,
    PODS,
    Res,
)
from capi_gpu_sim import devflow
from capi_gpu_sim.cluster_autoscaler import ClusterAutoscaler
from capi_gpu_sim.world import World

REPLICASETS = Res("apps", "v1", "replicasets")
WORKLOAD_LABEL = "capi-gpu.e2e/ca-workload"


def replicaset(name: str, template: str) -> dict[str, Any]:
    pod = devflow.claim_pod(name, template)
    labels = {WORKLOAD_LABEL: name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod["spec"]},
        },
    }


def submit(world: World, names: list[str], template: str = "mig-1g-24gb") -> None:
    for name in names:
        world.k.create(REPLICASETS, replicaset(name, template), ns(world))


def remove(world: World, names: list[str]) -> None:
    for name in names:
        world.k.delete(REPLICASETS, name, ns(world))


def pods(world: World) -> dict[str, dict[str, Any]]:
    """The workloads' live pods (not terminating), by ReplicaSet name."""
    out = {}
    for p in world.k.list(PODS, ns(world), label_selector=WORKLOAD_LABEL):
        if not p["metadata"].get("deletionTimestamp"):
            out[p["metadata"]["labels"][WORKLOAD_LABEL]] = p
    return out


def placement(world: World) -> dict[str, str | None]:
    """ReplicaSet -> node of its live pod (None while pending)."""
    return {rs: (p.get("spec") or {}).get("nodeName") for rs, p in pods(world).items()}


def all_bound(world: World, names: list[str]) -> dict[str, str] | None:
    """Every named workload's pod bound through the gate: allocated a GPU-ready node's bare gate device (no
    binding conditions to answer), or one with binding conditions the gate answered True; else None."""
    got = placement(world)
    if set(got) != set(names) or any(n is None for n in got.values()):
        return None
    for p in pods(world).values():
        claim = pod_claim(world, p["metadata"]["name"])
        results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        gate = [r for r in results if r.get("driver") == domain.GATE_DRIVER]
        if not gate:
            return None
        if not any(r.get("bindingConditions") for r in gate):
            continue
        conds = next(
            (
                {c["type"]: c["status"] for c in d.get("conditions") or []}
                for d in ((claim or {}).get("status") or {}).get("devices") or []
                if d.get("driver") == domain.GATE_DRIVER
            ),
            {},
        )
        if conds.get(domain.GATE_BINDING_CONDITION) != "True":
            return None
    return {k: v for k, v in got.items() if v is not None}


def gate_devices(world: World, pod_names: list[str]) -> list[tuple[str, str]]:
    """(pool, device) of each pod's gate result."""
    out = []
    for name in pod_names:
        for r in (((pod_claim(world, name) or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []:
            if r.get("driver") == domain.GATE_DRIVER:
                out.append((r["pool"], r["device"]))
    return out


def replicas(world: World, md: str = MD_NAME) -> int:
    return int(world.k.get(CAPI_MACHINEDEPLOYMENTS, md, ns(world))["spec"].get("replicas") or 0)


def set_group_size(world: World, md: str, low: int, high: int) -> None:
    ann = {domain.CA_MIN_SIZE_ANNOTATION: str(low), domain.CA_MAX_SIZE_ANNOTATION: str(high)}
    world.k.patch(CAPI_MACHINEDEPLOYMENTS, md, {"metadata": {"annotations": ann}}, ns(world))


def alive(ca: ClusterAutoscaler) -> None:
    if not ca.alive():
        raise AssertionError(f"cluster-autoscaler exited; its log: {ca.log_path}\n{ca.log()[-3000:]}")


def registered(ca: ClusterAutoscaler) -> dict[str, Any]:
    """CA's cluster-wide registered-node counts from its status ConfigMap."""
    counts = ((ca.status().get("clusterWide") or {}).get("health") or {}).get("nodeCounts") or {}
    return counts.get("registered") or {}


def management_nodes(world: World) -> int:
    """The pod runner's control-plane node in a release world: CA counts it like any registered node."""
    return len(world.k.list(NODES, label_selector="node-role.kubernetes.io/control-plane"))


def ca_sees_ready(world: World, ca: ClusterAutoscaler, count: int) -> dict[str, Any] | None:
    """CA's status and metrics count ``count`` ready GPU nodes (and the management nodes, which it sees too)
    and none not-started or unready; else None."""
    alive(ca)
    count += management_nodes(world)
    reg = registered(ca)
    unready = (reg.get("unready") or {}).get("total", 0)
    if reg.get("ready") != count or reg.get("notStarted", 0) or unready:
        return None
    m = ca.metrics()
    if m.get('cluster_autoscaler_nodes_count{state="ready"}') != count:
        return None
    if m.get('cluster_autoscaler_nodes_count{state="notStarted"}') or m.get(
        'cluster_autoscaler_nodes_count{state="unready"}'
    ):
        return None
    return {"status": reg, "metrics": {k: v for k, v in m.items() if "nodes_count" in k}}


def gpu_ready_untainted(world: World) -> list[str]:
    """GPU-ready nodes CA should count ready: not startup-tainted, and not being removed by CA or CAPI."""
    leaving = {domain.NODE_STARTUP_TAINT, "ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler"}
    return sorted(
        n["metadata"]["name"]
        for n in gpu_nodes(world)
        if not any(t.get("key") in leaving for t in n["spec"].get("taints") or [])
        and not n["spec"].get("unschedulable")
        and not n["metadata"].get("deletionTimestamp")
        and any(
            c.get("type") == domain.GPU_READY_CONDITION and c.get("status") == "True"
            for c in (n.get("status") or {}).get("conditions") or []
        )
    )


@dataclass
class Watch:
    """Samples, while a scenario runs, what CA said about nodes that were already GPU-ready."""

    world: World
    ca: ClusterAutoscaler
    lagging: list[str] = field(default_factory=list)
    _since: dict[str, float] = field(default_factory=dict)

    def sample(self) -> None:
        alive(self.ca)
        now = time.monotonic()
        ready = gpu_ready_untainted(self.world)
        for n in ready:
            self._since.setdefault(n, now)
        reg = registered(self.ca)
        settled = [n for n in ready if now - self._since[n] > 15.0]  # several CA loops after the lift
        if settled and int(reg.get("ready", 0)) - management_nodes(self.world) < len(settled):
            self.lagging.append(f"{len(settled)} GPU-ready for >15 s, CA ready={reg.get('ready')}: {reg}")


def wait_sampling(world: World, watch: Watch, what: str, fn: Any, timeout: float) -> Any:
    def probe() -> Any:
        watch.sample()
        return fn()

    return wait(world, what, probe, timeout, interval=1.0)


def set_owner(world: World, md: str, owner: str) -> None:
    """The owner annotation and label, the label also in the Machine template: CA 1.36.1 applies its
    discovery label filter to every Machine and MachineSet it looks up, not only to the MachineDeployment,
    so a node whose Machine lacks the label belongs to no group (CAPI copies template labels in place)."""
    mark = {domain.ANNOTATION_SCALER_OWNER: owner}
    body = {"metadata": {"annotations": mark, "labels": mark}, "spec": {"template": {"metadata": {"labels": mark}}}}
    world.k.patch(CAPI_MACHINEDEPLOYMENTS, md, body, ns(world))


def owner_labelled(world: World, md: str, owner: str) -> bool:
    """Every Machine and MachineSet of ``md`` carries the owner label (CAPI propagated it)."""
    selector = f"{domain.CAPI_DEPLOYMENT_NAME_LABEL}={md}"
    objs = [*world.k.list(CAPI_MACHINES, ns(world), label_selector=selector)]
    objs += world.k.list(CAPI_MACHINESETS, ns(world), label_selector=selector)
    return all((o["metadata"].get("labels") or {}).get(domain.LABEL_SCALER_OWNER) == owner for o in objs)
