"""Starts the claim-aware scaler for a Cluster once its ``<cluster>-kubeconfig`` Secret exists, and restarts
it when that Secret changes (a rotated kubeconfig). The scaler reads the workload cluster with its own
client, the way the readiness gate does, and writes only to the management cluster (MachineDeployments,
Events)."""

from __future__ import annotations

import datetime
from typing import Any

from capi_gpu.autoscaler.scaler import ClaimScaler
from capi_gpu.kube import AsyncKube
from capi_gpu.runtime import workload
from capi_gpu.runtime.deps import Deps
from capi_gpu.runtime.settings import PodPolicy

WORKERS = 2  # a pass makes two list calls on the workload cluster, one after the other
WATCHES = 3  # pods, claims, slices (and CA's Events with --claim-scaler-pods ca-declined)


async def run(deps: Deps, namespace: str, cluster: str, stopped: Any) -> None:
    policy = deps.settings.claim_scaler_pods

    async def scaler(client: AsyncKube) -> None:
        grace = datetime.timedelta(seconds=deps.settings.claim_scaler_ca_grace)
        await ClaimScaler(deps, namespace, cluster, client, pods=policy, ca_grace=grace).run(stopped)

    watches = WATCHES + (policy is PodPolicy.CA_DECLINED)
    await workload.supervise(deps, namespace, cluster, "claim scaler", scaler, stopped, WORKERS, watches)


async def run_for(deps: Deps, namespace: str, infra_cluster: str, stopped: Any) -> None:
    """For a HetznerGPUCluster: wait until CAPI made it owned by its Cluster, then scale for that Cluster."""
    cluster = await workload.owner_cluster(deps, namespace, infra_cluster, stopped)
    if cluster is not None:
        await run(deps, namespace, cluster, stopped)
