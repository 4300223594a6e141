"""Reaching a workload cluster the CAPI way: its ``<cluster>-kubeconfig`` Secret, with a client of its own.

A kopf operator holds the management cluster's credentials only; the per-Cluster daemons (the readiness
gate, the claim-aware scaler, remediation's node reads) each open their own client from that Secret,
and restart when it changes (a rotated kubeconfig) or their task fails. This is the one place that
knows how, so the daemons stay about what they do.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import yaml

from capi_gpu.controllers.deps import Deps
from capi_gpu.kube import SECRETS, AsyncKube, Kube, ours

log = logging.getLogger(__name__)
CLUSTERS = ours("hetznergpuclusters")
RESTART_DELAY = 5.0
RECHECK = 30.0

Task = Callable[[AsyncKube], Coroutine[Any, Any, None]]


async def kubeconfig(deps: Deps, namespace: str, cluster: str) -> tuple[str, dict[str, Any]] | None:
    """(resourceVersion, kubeconfig) of ``<cluster>-kubeconfig``; None until CAPI wrote it."""
    secret = await deps.kube.get_or_none(SECRETS, f"{cluster}-kubeconfig", namespace)
    if secret is None or "value" not in (secret.get("data") or {}):
        return None
    doc = yaml.safe_load(base64.b64decode(secret["data"]["value"]))
    return str(secret["metadata"]["resourceVersion"]), doc


async def client(deps: Deps, namespace: str, cluster: str) -> Kube | None:
    """A one-off synchronous client (close it), for a single read such as remediation's Node check."""
    found = await kubeconfig(deps, namespace, cluster)
    return Kube.from_kubeconfig_dict(found[1]) if found else None


async def supervise(
    deps: Deps, namespace: str, cluster: str, what: str, task: Task, stopped: Any, workers: int, watches: int
) -> None:
    """Run ``task(workload)`` for as long as the daemon lives, restarting on kubeconfig change or crash."""
    while not stopped:
        found = await kubeconfig(deps, namespace, cluster)
        if found is None:
            await asyncio.sleep(10)
            continue
        version, doc = found
        # One pooled connection per worker thread plus one per long-running watch.
        workload = AsyncKube(Kube.from_kubeconfig_dict(doc, pool_size=workers + watches), workers=workers)
        running: asyncio.Task[None] = asyncio.create_task(task(workload))
        try:
            while not stopped and not running.done():
                await asyncio.wait({running}, timeout=RECHECK)
                if running.done():
                    break
                again = await kubeconfig(deps, namespace, cluster)
                if again is None or again[0] != version:
                    log.info("%s %s/%s: kubeconfig changed; restarting", what, namespace, cluster)
                    break
        finally:
            running.cancel()
            outcome: BaseException | None = (await asyncio.gather(running, return_exceptions=True))[0]
            workload.close()
        if isinstance(outcome, Exception):
            # A crashed task leaves its cluster unanswered: say why, then start over from a relist.
            log.error("%s %s/%s failed; restarting in %.0fs", what, namespace, cluster, RESTART_DELAY, exc_info=outcome)
            await asyncio.sleep(RESTART_DELAY)


async def owner_cluster(deps: Deps, namespace: str, infra_cluster: str, stopped: Any) -> str | None:
    """The CAPI Cluster owning a HetznerGPUCluster, once CAPI set the ownerRef; None if it is gone."""
    while not stopped:
        obj = await deps.kube.get_or_none(CLUSTERS, infra_cluster, namespace)
        if obj is None:
            return None
        owner = next((o for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == "Cluster"), None)
        if owner is not None:
            return str(owner["name"])
        await asyncio.sleep(5)
    return None
