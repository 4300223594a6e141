"""Starts the claim-aware scaler for a Cluster once its ``<cluster>-kubeconfig`` Secret exists, and restarts
it when that Secret changes (a rotated kubeconfig). The scaler reads the workload cluster with its own
client, the way the readiness gate does, and writes only to the management cluster (MachineDeployments,
Events)."""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import yaml

from capi_gpu.autoscaler.scaler import ClaimScaler
from capi_gpu.controllers.deps import Deps
from capi_gpu.kube import SECRETS, AsyncKube, Kube, ours

log = logging.getLogger(__name__)
CLUSTERS = ours("hetznergpuclusters")
WORKERS = 2  # a pass makes two list calls on the workload cluster, one after the other


async def workload_kubeconfig(deps: Deps, namespace: str, cluster: str) -> tuple[str, dict[str, Any]] | None:
    """(resourceVersion, kubeconfig) of CAPI's ``<cluster>-kubeconfig`` Secret; None until it exists."""
    secret = await deps.kube.get_or_none(SECRETS, f"{cluster}-kubeconfig", namespace)
    if secret is None or "value" not in (secret.get("data") or {}):
        return None
    doc = yaml.safe_load(base64.b64decode(secret["data"]["value"]))
    return str(secret["metadata"]["resourceVersion"]), doc


async def run(deps: Deps, namespace: str, cluster: str, stopped: Any) -> None:
    while not stopped:
        found = await workload_kubeconfig(deps, namespace, cluster)
        if found is None:
            await asyncio.sleep(10)
            continue
        version, doc = found
        # One pooled connection per worker thread plus one per informer watch (pods, claims, slices).
        workload = AsyncKube(Kube.from_kubeconfig_dict(doc, pool_size=WORKERS + 3), workers=WORKERS)
        task = asyncio.create_task(ClaimScaler(deps, namespace, cluster, workload).run(stopped))
        try:
            while not stopped and not task.done():
                await asyncio.sleep(30)
                again = await workload_kubeconfig(deps, namespace, cluster)
                if again is None or again[0] != version:
                    log.info("claim scaler %s/%s: kubeconfig changed; restarting", namespace, cluster)
                    break
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.warning("claim scaler %s/%s ended: %s; restarting", namespace, cluster, task.exception())
                await asyncio.sleep(5)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            workload.close()


async def run_for(deps: Deps, namespace: str, infra_cluster: str, stopped: Any) -> None:
    """For a HetznerGPUCluster: wait until CAPI made it owned by its Cluster, then scale for that Cluster."""
    while not stopped:
        obj = await deps.kube.get_or_none(CLUSTERS, infra_cluster, namespace)
        if obj is None:
            return
        owner = next((o for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == "Cluster"), None)
        if owner is not None:
            await run(deps, namespace, owner["name"], stopped)
            return
        await asyncio.sleep(5)
