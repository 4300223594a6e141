"""Starts the per-Cluster gate once the workload cluster's kubeconfig Secret exists, and restarts it if
that Secret changes (a rotated kubeconfig) or the gate crashed (logged, then a fresh gate relists). The
workload client is the gate's own, never the operator's."""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import yaml

from capi_gpu.controllers.deps import Deps
from capi_gpu.kube import SECRETS, AsyncKube, Kube
from capi_gpu.readiness.gate import ClusterGate

log = logging.getLogger(__name__)
RESTART_DELAY = 5.0
WORKERS = 8


async def _kubeconfig(deps: Deps, namespace: str, cluster: str) -> tuple[str, dict[str, Any]] | None:
    secret = await deps.kube.get_or_none(SECRETS, f"{cluster}-kubeconfig", namespace)
    if secret is None or "value" not in (secret.get("data") or {}):
        return None
    doc = yaml.safe_load(base64.b64decode(secret["data"]["value"]))
    return str(secret["metadata"]["resourceVersion"]), doc


async def run(deps: Deps, namespace: str, cluster: str, stopped: Any) -> None:
    while not stopped:
        found = await _kubeconfig(deps, namespace, cluster)
        if found is None:
            await asyncio.sleep(10)
            continue
        version, doc = found
        # One pooled connection per worker thread plus one per informer watch (Nodes, slices, claims).
        workload = AsyncKube(Kube.from_kubeconfig_dict(doc, pool_size=WORKERS + 3), workers=WORKERS)
        gate = ClusterGate(deps, namespace, cluster, workload)
        task = asyncio.create_task(gate.run(stopped))
        try:
            while not stopped and not task.done():
                await asyncio.wait({task}, timeout=30)
                if task.done():
                    break
                again = await _kubeconfig(deps, namespace, cluster)
                if again is None or again[0] != version:
                    log.info("gate %s/%s: kubeconfig changed; restarting", namespace, cluster)
                    break
        finally:
            task.cancel()
            (outcome,) = await asyncio.gather(task, return_exceptions=True)
            workload.close()
        if isinstance(outcome, Exception):
            # A crashed gate leaves nodes and claims unanswered: say why, then start over from a relist.
            log.error("gate %s/%s failed; restarting in %.0fs", namespace, cluster, RESTART_DELAY, exc_info=outcome)
            await asyncio.sleep(RESTART_DELAY)


async def run_for(deps: Deps, namespace: str, infra_cluster: str, stopped: Any) -> None:
    """For a HetznerGPUCluster: wait until CAPI made it owned by its Cluster, then gate that Cluster."""
    from capi_gpu.kube import ours

    while not stopped:
        obj = await deps.kube.get_or_none(ours("hetznergpuclusters"), infra_cluster, namespace)
        if obj is None:
            return
        owner = next((o for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == "Cluster"), None)
        if owner is not None:
            await run(deps, namespace, owner["name"], stopped)
            return
        await asyncio.sleep(5)
