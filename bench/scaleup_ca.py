"""``bench/scaleup.py --autoscaler ca``: the same scale-up, asked of the real cluster-autoscaler by pods.

Instead of raising the replicas itself, the bench submits one ``mig-2g-48gb`` claim pod per node it
wants (all-balanced has one 2g.48gb per node, so n pods need exactly n nodes) and CA (1.36.1, clusterapi
provider, ``capi_gpu_sim.cluster_autoscaler``) raises the MachineDeployment. CA 1.36.1 cannot scale a MIG
group from zero (docs/autoscaling.md), so the group starts at one node (min 1) holding one such pod, and
CA copies that node as its template. ``decision_s`` is the time from the pods' creation to CA's raise.
"""

from __future__ import annotations

import time
from typing import Any

from capi_gpu import domain
from capi_gpu.kube import CAPI_MACHINEDEPLOYMENTS, NODES, PODS
from capi_gpu_sim import devflow
from capi_gpu_sim.cluster_autoscaler import ClusterAutoscaler, Options
from capi_gpu_sim.world import World

TEMPLATE = "mig-2g-48gb"


def _until(what: str, fn: Any, timeout: float, world: World) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not after {timeout:.0f}s; see {world.config.state_dir}")
        time.sleep(0.5)
    return value


def replicas(world: World) -> int:
    md = world.k.get(CAPI_MACHINEDEPLOYMENTS, f"{world.config.cluster}-gpu", world.config.namespace)
    return int(md["spec"].get("replicas") or 0)


def prepare(world: World, max_size: int, timeout: float) -> ClusterAutoscaler:
    """One GPU node holding one 2g pod, the group's min/max set, then CA started on it."""
    ns, md = world.config.namespace, f"{world.config.cluster}-gpu"
    ann = {domain.CA_MIN_SIZE_ANNOTATION: "1", domain.CA_MAX_SIZE_ANNOTATION: str(max_size)}
    world.k.patch(CAPI_MACHINEDEPLOYMENTS, md, {"metadata": {"annotations": ann}}, ns)
    world.add_host()
    world.scale(1)

    def ready() -> bool:
        nodes = world.k.list(NODES)
        return len(nodes) == 1 and domain.NODE_STARTUP_TAINT not in {
            t["key"] for t in nodes[0]["spec"].get("taints") or []
        }

    _until("the base node GPU-ready", ready, timeout, world)
    world.k.create(PODS, devflow.claim_pod("base-2g", TEMPLATE), ns)
    _until("the base pod bound", lambda: world.k.get(PODS, "base-2g", ns)["spec"].get("nodeName"), 120, world)
    # A burst of cold hosts queues on Ansible: CA must not give up on a node that is only queued.
    opts = Options(
        namespace=ns,
        cluster=world.config.cluster,
        state_dir=world.config.state_dir,
        extra_args=("--max-node-provision-time=60m",),
    )
    return ClusterAutoscaler(world.k, world.cp.kubeconfig, opts).start()


def demand(world: World, n: int, tag: str) -> None:
    for i in range(n):
        world.k.create(PODS, devflow.claim_pod(f"ca-{tag}-{i}", TEMPLATE), world.config.namespace)


def decision_s(world: World, before: int, t0: float, timeout: float) -> float:
    """Seconds from ``t0`` until CA raised the replicas above ``before``."""
    _until("CA raising the MachineDeployment", lambda: replicas(world) > before, timeout, world)
    return round(time.monotonic() - t0, 1)
