"""Reaching a workload cluster the CAPI way: its ``<cluster>-kubeconfig`` Secret, with a client of its own.

A kopf operator holds the management cluster's credentials only; the per-Cluster daemons (the readiness
gate, the claim-aware scaler, remediation's node reads) each open their own client from that Secret,
and restart when it changes (a rotated kubeconfig) or their task fails. This is the one place that
knows how, so the daemons stay about what they do.

The Secret is data, not code: whoever can write Secrets in a namespace could otherwise make the operator run
a command (``exec``, an ``auth-provider`` with a ``cmd-path``) or read its own files (``tokenFile``, a
``certificate-authority`` path). CAPI writes kubeconfigs with inline certificates or tokens, so only those
fields are accepted; anything else is refused before the client library sees it, with a condition on the
HetznerGPUCluster and an Event.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import yaml

from capi_gpu.api import conditions as c
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.kube import SECRETS, AsyncKube, Kube, Obj, ours
from capi_gpu.runtime import events, pause
from capi_gpu.runtime.deps import AccessError, Deps

log = logging.getLogger(__name__)
CLUSTERS = ours("hetznergpuclusters")
RESTART_DELAY = 5.0
RECHECK = 30.0

Task = Callable[[AsyncKube], Coroutine[Any, Any, None]]

# Inline credentials only: every other key either runs something, reads a file, or is unknown to us.
USER_FIELDS = frozenset({"client-certificate-data", "client-key-data", "token", "username", "password"})
CLUSTER_FIELDS = frozenset(
    {"server", "certificate-authority-data", "insecure-skip-tls-verify", "tls-server-name", "extensions"}
)


class UnsafeKubeconfig(AccessError):
    """``<cluster>-kubeconfig`` asks for more than inline credentials; it is never loaded."""

    def __init__(self, message: str) -> None:
        super().__init__(c.Reason.KUBECONFIG_REJECTED, message)


def unsafe_fields(doc: Any) -> list[str]:
    """Where ``doc`` (a parsed kubeconfig) goes beyond inline credentials, as ``users[name].field``; [] if safe."""
    if not isinstance(doc, dict):
        return ["<not a mapping>"]
    found: list[str] = []
    for section, key, allowed in (("users", "user", USER_FIELDS), ("clusters", "cluster", CLUSTER_FIELDS)):
        for entry in doc.get(section) or []:
            body = entry.get(key) if isinstance(entry, dict) else None
            if not isinstance(body, dict):
                found.append(f"{section}[?].{key}")
                continue
            found += [f"{section}[{entry.get('name')}].{f}" for f in sorted(set(body) - allowed)]
    return found


def parse(secret: Obj) -> dict[str, Any]:
    """The kubeconfig in a ``<cluster>-kubeconfig`` Secret, checked; raises ``UnsafeKubeconfig``."""
    name = secret["metadata"]["name"]
    try:
        doc = yaml.safe_load(base64.b64decode(secret["data"]["value"]))
    except (ValueError, yaml.YAMLError) as exc:
        raise UnsafeKubeconfig(f"Secret {name}: the kubeconfig is not YAML") from exc
    bad = unsafe_fields(doc)
    if bad:
        raise UnsafeKubeconfig(
            f"Secret {name}: refused, it asks for more than inline credentials ({', '.join(bad)}); "
            "exec plugins, auth providers and file paths are never loaded"
        )
    return dict(doc)


async def kubeconfig(deps: Deps, namespace: str, cluster: str) -> tuple[str, dict[str, Any]] | None:
    """(resourceVersion, kubeconfig) of ``<cluster>-kubeconfig``; None until CAPI wrote it.

    Raises ``UnsafeKubeconfig`` for one that would run a command or read a file."""
    secret = await deps.kube.get_or_none(SECRETS, f"{cluster}-kubeconfig", namespace)
    if secret is None or "value" not in (secret.get("data") or {}):
        return None
    return str(secret["metadata"]["resourceVersion"]), parse(secret)


async def _report(deps: Deps, namespace: str, cluster: str, refused: UnsafeKubeconfig | None) -> None:
    """The verdict as the ``WorkloadKubeconfigValid`` condition of the Cluster's HetznerGPUCluster(s)."""
    for hgc in await deps.kube.list(CLUSTERS, namespace):
        owners = hgc["metadata"].get("ownerReferences") or []
        if not any(o.get("kind") == "Cluster" and o.get("name") == cluster for o in owners):
            continue
        conds = HetznerGPUCluster.model_validate(hgc).status.conditions
        before = c.get(conds, c.Type.WORKLOAD_KUBECONFIG_VALID)
        ok = refused is None
        if (before.status == "True" if before else True) == ok:
            continue  # unchanged, or fine and never refused: no write
        reason, msg = (c.Reason.READY, "") if ok else (c.Reason.KUBECONFIG_REJECTED, str(refused))
        conds = c.set_condition(conds, c.Type.WORKLOAD_KUBECONFIG_VALID, ok, reason, msg, deps.clock())
        patch = {"status": {"conditions": [x.wire() for x in conds]}}
        await deps.kube.patch(CLUSTERS, hgc["metadata"]["name"], patch, namespace, sub="status")
        if not ok:
            events.emit(hgc, str(reason), msg, warning=True)


async def client(deps: Deps, namespace: str, cluster: str) -> Kube | None:
    """A one-off synchronous client (close it), for a single read such as remediation's Node check."""
    found = await kubeconfig(deps, namespace, cluster)
    return Kube.from_kubeconfig_dict(found[1]) if found else None


async def supervise(
    deps: Deps, namespace: str, cluster: str, what: str, task: Task, stopped: Any, workers: int, watches: int
) -> None:
    """Run ``task(workload)`` for as long as the daemon lives, restarting on kubeconfig change or crash,
    and not at all while the Cluster is paused (clusterctl move: the source must stop writing)."""
    while not stopped:
        if await pause.cluster_paused(deps, namespace, cluster):
            await asyncio.sleep(RECHECK)
            continue
        try:
            found = await kubeconfig(deps, namespace, cluster)
        except UnsafeKubeconfig as exc:
            log.warning("%s %s/%s: %s", what, namespace, cluster, exc)
            await _report(deps, namespace, cluster, exc)
            await asyncio.sleep(RECHECK)
            continue
        if found is None:
            await asyncio.sleep(10)
            continue
        await _report(deps, namespace, cluster, None)
        version, doc = found
        # One pooled connection per worker thread plus one per long-running watch.
        workload = AsyncKube(Kube.from_kubeconfig_dict(doc, pool_size=workers + watches), workers=workers)
        running: asyncio.Task[None] = asyncio.create_task(task(workload))
        try:
            while not stopped and not running.done():
                await asyncio.wait({running}, timeout=RECHECK)
                if running.done():
                    break
                try:
                    again = await kubeconfig(deps, namespace, cluster)
                except UnsafeKubeconfig:
                    again = None  # the next round reports it
                if again is None or again[0] != version:
                    log.info("%s %s/%s: kubeconfig changed; restarting", what, namespace, cluster)
                    break
                if await pause.cluster_paused(deps, namespace, cluster):
                    log.info("%s %s/%s: Cluster paused; stopping until it is resumed", what, namespace, cluster)
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
