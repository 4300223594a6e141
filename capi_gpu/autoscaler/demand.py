"""Pending GPU demand in a workload cluster: which unschedulable pods wait for which MIG profiles or whole
GPUs, read from the pods, their ResourceClaims (or the ResourceClaimTemplates they will be made from) and
the DeviceClasses. Pure: dicts as the apiserver returns them in, planner requests out.

A pod counts when the scheduler gave up on it (``PodScheduled=False``, reason ``Unschedulable``), or when
it has waited unbound for longer than a grace period (a scheduler in backoff may not have said so yet).
Pods with scheduling gates are held on purpose and never count. A claim that is already allocated is
served, whatever the pod waits for; a claim shared by several pods counts once.

All or nothing per pod: a pod counts only when every device request of its unallocated claims is one
``selectors`` understands (our gate request is always satisfied by a GPU node, so it is skipped). A pod
that also needs a device the scaler cannot reason about is ignored with the reason: a GPU node alone
might not make it schedulable. Within a claim, each request (and each device of a ``count``) is planned
as one device; that several of them must share a node is not modelled (the packing planner's limit).

Next to cluster-autoscaler (``runtime.settings.PodPolicy.CA_DECLINED``), a GPU pod also needs CA's
``NotTriggerScaleUp`` on it to count: what CA scales for, or has not answered for yet, is CA's.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from capi_gpu.autoscaler import ca_verdicts, selectors
from capi_gpu.autoscaler.selectors import Kind, NotOurs
from capi_gpu.gpu import packing
from capi_gpu.gpu.packing import Request
from capi_gpu.unstructured import as_map, parse_time

Key = tuple[str, str]  # (namespace, name)
DEFAULT_GRACE = datetime.timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class Ignored:
    pod: str  # namespace/name
    reason: str


@dataclass(frozen=True, slots=True)
class Demand:
    requests: tuple[Request, ...]  # merged: one entry per distinct alternatives list
    pods: tuple[str, ...]  # the pods that make it up
    ignored: tuple[Ignored, ...]
    left_to_ca: tuple[Ignored, ...] = ()  # GPU pods cluster-autoscaler serves or has not answered for yet

    def summary(self) -> str:
        return ", ".join(f"{r.count}x {'|'.join(r.alternatives)}" for r in self.requests) or "nothing"


def unschedulable(pod: Mapping[str, Any], now: datetime.datetime, grace: datetime.timedelta = DEFAULT_GRACE) -> bool:
    """Unbound, pending, not gated, and either marked Unschedulable or waiting longer than ``grace``."""
    meta, spec, status = as_map(pod.get("metadata")), as_map(pod.get("spec")), as_map(pod.get("status"))
    if spec.get("nodeName") or meta.get("deletionTimestamp") or spec.get("schedulingGates"):
        return False
    if status.get("phase", "Pending") != "Pending":
        return False
    for c in status.get("conditions") or ():
        cond = as_map(c)
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return True
    created = parse_time(meta.get("creationTimestamp"))
    return created is not None and now - created >= grace


def claim_requests(spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> list[Request]:
    """The planner requests of one claim spec (gate requests skipped); NotOurs with the reason."""
    out: list[Request] = []
    for raw in as_map(spec.get("devices")).get("requests") or ():
        req = as_map(raw)
        if "exactly" in req:
            exact = as_map(req["exactly"])
            want = selectors.resolve(str(exact.get("deviceClassName", "")), exact.get("selectors") or (), classes)
            if want.kind is Kind.GATE or exact.get("adminAccess"):
                continue  # the gate comes with every GPU node; admin access takes no device
            out.append(Request((_alternative(want),), _count(exact)))
        elif "firstAvailable" in req:
            out.append(_first_available(req["firstAvailable"] or (), classes))
        else:
            raise NotOurs(f"request {req.get('name')!r} has neither exactly nor firstAvailable")
    return out


def _first_available(subs: Iterable[Any], classes: Mapping[str, Mapping[str, Any]]) -> Request:
    alternatives: list[str] = []
    counts = set()
    for raw in subs:
        sub = as_map(raw)
        want = selectors.resolve(str(sub.get("deviceClassName", "")), sub.get("selectors") or (), classes)
        if want.kind is Kind.GATE:
            raise NotOurs("the gate device as a firstAvailable alternative")
        counts.add(_count(sub))
        if _alternative(want) not in alternatives:
            alternatives.append(_alternative(want))
    if len(counts) != 1:
        raise NotOurs("firstAvailable alternatives with different counts")
    return Request(tuple(alternatives), counts.pop())


def _alternative(want: selectors.Want) -> str:
    return want.profile if want.kind is Kind.MIG and want.profile else packing.WHOLE_GPU


def _count(request: Mapping[str, Any]) -> int:
    if request.get("allocationMode", "ExactCount") != "ExactCount":
        raise NotOurs(f"allocationMode {request.get('allocationMode')} (all devices of a kind)")
    count = request.get("count", 1)
    return count if isinstance(count, int) and count > 0 else 1


def _pod_claims(
    pod: Mapping[str, Any], claims: Mapping[Key, Mapping[str, Any]], templates: Mapping[Key, Mapping[str, Any]]
) -> list[tuple[Key, Mapping[str, Any]]]:
    """(claim key, claim spec) for every unallocated claim of the pod; NotOurs when one can't be found."""
    ns = str(as_map(pod.get("metadata")).get("namespace", ""))
    generated = {
        str(as_map(s).get("name")): as_map(s).get("resourceClaimName")
        for s in as_map(pod.get("status")).get("resourceClaimStatuses") or ()
    }
    out: list[tuple[Key, Mapping[str, Any]]] = []
    for raw in as_map(pod.get("spec")).get("resourceClaims") or ():
        ref = as_map(raw)
        name = ref.get("resourceClaimName") or generated.get(str(ref.get("name")))
        if name:
            claim = claims.get((ns, str(name)))
            if claim is None:
                raise NotOurs(f"ResourceClaim {name} not found")
            if as_map(claim.get("status")).get("allocation"):
                continue
            out.append(((ns, str(name)), as_map(claim.get("spec"))))
        elif ref.get("resourceClaimTemplateName"):
            tpl = templates.get((ns, str(ref["resourceClaimTemplateName"])))
            if tpl is None:
                raise NotOurs(f"ResourceClaimTemplate {ref['resourceClaimTemplateName']} not found")
            pod_name = str(as_map(pod.get("metadata")).get("name", ""))
            out.append(((ns, f"{pod_name}/{ref.get('name')}"), as_map(as_map(tpl.get("spec")).get("spec"))))
    return out


def pending_demand(
    pods: Iterable[Mapping[str, Any]],
    claims: Mapping[Key, Mapping[str, Any]],
    templates: Mapping[Key, Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    now: datetime.datetime,
    grace: datetime.timedelta = DEFAULT_GRACE,
    ca_said: Mapping[Key, ca_verdicts.Said] | None = None,
    ca_grace: datetime.timedelta = datetime.timedelta(0),
) -> Demand:
    """The GPU demand of the unschedulable pods, with the pods ignored and why. With ``ca_said`` (CA's
    verdicts, ``PodPolicy.CA_DECLINED``) a GPU pod counts only when cluster-autoscaler declined it."""
    merged: Counter[tuple[str, ...]] = Counter()
    counted: set[Key] = set()
    waiting: list[str] = []
    ignored: list[Ignored] = []
    left: list[Ignored] = []
    for pod in sorted(pods, key=_pod_key):
        if not unschedulable(pod, now, grace):
            continue
        name = "/".join(_pod_key(pod))
        try:
            found = [(key, claim_requests(spec, classes)) for key, spec in _pod_claims(pod, claims, templates)]
        except NotOurs as exc:
            ignored.append(Ignored(name, str(exc)))
            continue
        why = ca_verdicts.left_to_ca(pod, ca_said, now, ca_grace) if ca_said is not None else None
        if why is not None and any(reqs for _, reqs in found):
            left.append(Ignored(name, why))
            continue
        fresh = [(key, reqs) for key, reqs in found if reqs and key not in counted]
        for key, reqs in fresh:
            counted.add(key)
            for r in reqs:
                merged[r.alternatives] += r.count
        if fresh:
            waiting.append(name)
    requests = tuple(Request(alts, n) for alts, n in sorted(merged.items()))
    return Demand(requests, tuple(waiting), tuple(ignored), tuple(left))


def index(objs: Iterable[Mapping[str, Any]]) -> dict[Key, Mapping[str, Any]]:
    """Namespaced objects by (namespace, name), as ``pending_demand`` takes claims and templates."""
    return {
        (str(as_map(o.get("metadata")).get("namespace", "")), str(as_map(o.get("metadata")).get("name"))): o
        for o in objs
    }


def _pod_key(obj: Mapping[str, Any]) -> Key:
    meta = as_map(obj.get("metadata"))
    return str(meta.get("namespace", "")), str(meta.get("name", ""))
