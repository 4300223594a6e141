"""The one pause rule every loop uses (hosts, machines, clusters, templates, remediations, the workload
daemons): an object is paused when its Cluster's ``spec.paused`` is true or the object carries
``cluster.x-k8s.io/paused``. That is CAPI's ``annotations.IsPaused(cluster, obj)``; we also count the
annotation on the Cluster itself, since CAPI's Cluster controller stops on it and everything we reconcile
for a Cluster is part of it: one rule, slightly stricter, never a loop that runs while its Cluster says
paused (clusterctl move pauses the Cluster before it copies anything). A paused loop writes nothing but its
``Paused`` condition, and that only when it changes, so the source of a move stays still.
"""

from __future__ import annotations

from datetime import datetime

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.base import Condition
from capi_gpu.kube import CAPI_CLUSTERS, Obj
from capi_gpu.runtime.deps import Deps


def annotated(obj: Obj | None) -> bool:
    return obj is not None and domain.PAUSED_ANNOTATION in (obj.get("metadata", {}).get("annotations") or {})


def is_paused(cluster: Obj | None, *objects: Obj | None) -> bool:
    """The rule, pure: ``cluster`` is the Cluster (None when there is none or it is not found), ``objects``
    the object reconciled and any it stands for (a host for its claiming machine)."""
    by_cluster = cluster is not None and (bool((cluster.get("spec") or {}).get("paused")) or annotated(cluster))
    return by_cluster or any(annotated(o) for o in objects)


def cluster_name(obj: Obj) -> str | None:
    """The Cluster an object belongs to: its cluster-name label, else a Cluster ownerReference."""
    meta = obj.get("metadata", {})
    label = (meta.get("labels") or {}).get(domain.CLUSTER_NAME_LABEL)
    if label:
        return str(label)
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Cluster"), None)
    return str(owner["name"]) if owner else None


async def cluster_paused(deps: Deps, namespace: str, cluster: str | None) -> bool:
    if not cluster:
        return False
    return is_paused(await deps.kube.get_or_none(CAPI_CLUSTERS, cluster, namespace))


async def paused(deps: Deps, namespace: str, obj: Obj, cluster: str | None = None) -> bool:
    return annotated(obj) or await cluster_paused(deps, namespace, cluster or cluster_name(obj))


def condition(conditions: list[Condition], is_paused: bool, now: datetime, generation: int | None) -> list[Condition]:
    reason = c.Reason.PAUSED if is_paused else c.Reason.NOT_PAUSED
    return c.set_condition(
        conditions,
        c.Type.PAUSED,
        is_paused,
        reason,
        "Cluster or object is paused" if is_paused else "",
        now,
        generation,
    )
