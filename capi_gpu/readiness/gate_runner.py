"""Runs the per-Cluster readiness gate under ``runtime.workload``'s supervision (own workload client,
restart on a rotated kubeconfig or a crash, a fresh gate relists)."""

from __future__ import annotations

from typing import Any

from capi_gpu.kube import AsyncKube
from capi_gpu.readiness import targets
from capi_gpu.readiness.gate import ClusterGate
from capi_gpu.runtime import workload
from capi_gpu.runtime.deps import Deps

WORKERS = 8
WATCHES = 5  # Nodes, ResourceSlices, ResourceClaims, the NVIDIA plugin's pods, the gate plugin's pods


async def run(deps: Deps, namespace: str, cluster: str, stopped: Any, infra_cluster: str | None = None) -> None:
    """Gate ``cluster``; with ``infra_cluster``, GPU-ready also needs the kubelet plugins' pods its
    HetznerGPUCluster names (read at each gate start: a change restarts the gate)."""

    async def gate(client: AsyncKube) -> None:
        plugins = () if infra_cluster is None else await targets.plugin_checks(deps.kube, namespace, infra_cluster)
        await ClusterGate(deps, namespace, cluster, client, plugins, infra_cluster).run(stopped)

    await workload.supervise(deps, namespace, cluster, "gate", gate, stopped, WORKERS, WATCHES)


async def run_for(deps: Deps, namespace: str, infra_cluster: str, stopped: Any) -> None:
    """For a HetznerGPUCluster: wait until CAPI made it owned by its Cluster, then gate that Cluster."""
    cluster = await workload.owner_cluster(deps, namespace, infra_cluster, stopped)
    if cluster is not None:
        await run(deps, namespace, cluster, stopped, infra_cluster)
