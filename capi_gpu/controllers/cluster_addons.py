"""The workload-cluster phase of the HetznerGPUCluster reconcile: NVIDIA's DRA driver chart, the gate driver
and the claim templates, installed by playbooks/addons.yml once the cluster's API answers; and, every
``features.RECHECK``, the check that its apiserver keeps the gate device's fields (``readiness.features``,
condition ``GateFeaturesAvailable``).

Why a phase of its own: the playbook run is slow (seconds of helm and ansible), so it runs only when what
it would apply changed (``AddonsRequest.digest`` against ``status.addons.appliedDigest``), after a failure
(retried with a backoff), or once an hour to undo drift; every other pass costs one Secret read. The
outcome is the ``AddonsReady`` condition, naming the chart version and, on failure, the failure class as
its reason. A failure never blocks nodes by itself: the gate goes by the driver's slices, not by this. A
chartRef outside the operator's allow-list (``provisioning.chartref``; the webhook refuses it, this is for
one written while it was off) runs nothing: AddonsReady False, reason ChartRefNotAllowed, and an Event.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import yaml

from capi_gpu.api import conditions as c
from capi_gpu.api.base import Condition
from capi_gpu.api.cluster import AddonsStatus, HetznerGPUCluster
from capi_gpu.kube import AsyncKube, Kube, KubeError
from capi_gpu.provisioning import addons, chartref
from capi_gpu.readiness import features
from capi_gpu.runtime import events, workload
from capi_gpu.runtime.deps import Deps

log = logging.getLogger(__name__)
REFRESH = timedelta(hours=1)
WAIT = 30.0
RETRY = 60.0


@dataclass(frozen=True)
class Phase:
    conditions: list[Condition]
    status: AddonsStatus
    requeue: float | None
    """Seconds until this phase wants another pass (the next feature probe at the latest); None: no need."""


def plugin_rollout(max_unavailable: str) -> dict[str, Any]:
    """The chart values that make its kubelet-plugin DaemonSet roll ``max_unavailable`` nodes at a time (pure;
    a count goes to the DaemonSet as a number, a percentage as a string, as Kubernetes' IntOrString wants)."""
    value: int | str = int(max_unavailable) if max_unavailable.isdigit() else max_unavailable
    return {"kubeletPlugin": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": value}}}}


def request_for(deps: Deps, hgc: HetznerGPUCluster) -> addons.AddonsRequest:
    spec = hgc.spec.addons
    default_ref = deps.settings.addons_chart or addons.DEFAULT_CHART_REF
    return addons.AddonsRequest(
        manage_dra_driver=spec.dra_driver.managed,
        chart_ref=spec.dra_driver.chart_ref or default_ref,
        chart_version=spec.dra_driver.chart_version,
        extra_values=plugin_rollout(spec.dra_driver.plugin_max_unavailable),
        claim_namespaces=tuple(spec.claim_namespaces),
        gate_plugin_image=deps.settings.gate_plugin_image,
    )


def _answers(doc: dict[str, Any]) -> bool:
    """One cheap read: an API that answers at all (even 404 or 403) is up; the play reports the rest."""
    kube = Kube.from_kubeconfig_dict(doc)
    try:
        kube.version()
        return True
    except KubeError:
        return True
    except Exception:  # refused, reset, TLS not up yet: not answering
        return False
    finally:
        kube.close()


async def _features(deps: Deps, doc: dict[str, Any]) -> list[str]:
    client = AsyncKube(Kube.from_kubeconfig_dict(doc), workers=1)
    try:
        return await features.check(client)
    finally:
        client.close()


async def reconcile(deps: Deps, hgc: HetznerGPUCluster, obj: dict[str, Any], cluster: str) -> Phase:
    """The add-ons and the gate's feature check for one workload cluster (the Cluster ``cluster``)."""
    conds, status = hgc.status.conditions, hgc.status.addons
    namespace, gen = str(obj["metadata"]["namespace"]), obj["metadata"].get("generation")
    now, key = deps.clock(), (namespace, cluster)
    request = request_for(deps, hgc)
    refused = chartref.refusal(hgc.spec.addons.dra_driver.chart_ref, deps.settings.chart_policy)
    if refused is not None and deps.addons is not None:
        return Phase(_refuse(obj, conds, refused, now, gen), status, None)
    version = request.chart_version if request.manage_dra_driver else "unmanaged"
    digest = request.digest(deps.addons.playbook_dir) if deps.addons is not None else ""
    fresh = status.applied_time is not None and now - status.applied_time < REFRESH
    settled = status.applied_digest == digest and fresh and c.is_true(conds, c.Type.ADDONS_READY)
    need_addons = deps.addons is not None and not settled
    probe_in = features.recheck_in(deps.features_probed.get(key), now)
    if probe_in > 0 and not need_addons:
        left = (status.applied_time + REFRESH - now).total_seconds() if deps.addons and status.applied_time else None
        return Phase(conds, status, probe_in if left is None else min(left, probe_in))
    try:
        found = await workload.kubeconfig(deps, namespace, cluster)
    except workload.UnsafeKubeconfig as exc:
        if need_addons:
            conds = c.set_condition(conds, c.Type.ADDONS_READY, False, exc.reason, str(exc), now, gen)
        return Phase(conds, status, WAIT)
    if found is None or not await asyncio.to_thread(_answers, found[1]):
        if need_addons:
            msg = f"waiting for {cluster}'s API to answer before installing dra-driver-nvidia-gpu {version}"
            waiting = c.Reason.WAITING_FOR_CONTROL_PLANE
            conds = c.set_condition(conds, c.Type.ADDONS_READY, False, waiting, msg, now, gen)
        return Phase(conds, status, WAIT)
    if probe_in == 0:
        conds = await _check_features(deps, obj, conds, found[1], now, gen)
        deps.features_probed[key] = now
    if not need_addons or deps.addons is None:
        return Phase(conds, status, features.RECHECK.total_seconds())
    return await _install(deps, obj, conds, found[1], request, digest)


def _refuse(obj: dict[str, Any], conds: list[Condition], why: str, now: datetime, gen: Any) -> list[Condition]:
    """A chartRef outside the allow-list (the webhook was off when it was written): nothing is fetched or run
    until the spec changes, and the user learns why from the condition and one Event."""
    before = c.get(conds, c.Type.ADDONS_READY)
    if before is None or before.reason != c.Reason.CHART_REF_NOT_ALLOWED or before.message != why:
        events.emit(obj, str(c.Reason.CHART_REF_NOT_ALLOWED), why, warning=True)
    return c.set_condition(conds, c.Type.ADDONS_READY, False, c.Reason.CHART_REF_NOT_ALLOWED, why, now, gen)


async def _check_features(
    deps: Deps, obj: dict[str, Any], conds: list[Condition], doc: dict[str, Any], now: datetime, gen: Any
) -> list[Condition]:
    try:
        missing = await _features(deps, doc)
    except KubeError as exc:  # refused for another reason (RBAC, admission): say so, the gate still runs
        ok, reason, msg = False, c.Reason.FEATURES_MISSING, f"the feature probe was refused: {exc}"
    else:
        ok, reason, msg = features.condition(missing)
    before = c.get(conds, c.Type.GATE_FEATURES_AVAILABLE)
    if not ok and (before is None or before.message != msg):
        events.emit(obj, str(reason), msg, warning=True)
    return c.set_condition(conds, c.Type.GATE_FEATURES_AVAILABLE, ok, reason, msg, now, gen)


async def _install(
    deps: Deps,
    obj: dict[str, Any],
    conds: list[Condition],
    doc: dict[str, Any],
    request: addons.AddonsRequest,
    digest: str,
) -> Phase:
    assert deps.addons is not None
    namespace, cluster_name = str(obj["metadata"]["namespace"]), str(obj["metadata"]["name"])
    now, gen = deps.clock(), obj["metadata"].get("generation")
    version = request.chart_version if request.manage_dra_driver else "unmanaged"
    outcome = await deps.addons.install(f"{namespace}.{cluster_name}", yaml.safe_dump(doc), request)
    if not outcome.ok:
        reason = str(outcome.failure or addons.Failure.FAILED)
        msg = f"dra-driver-nvidia-gpu {version}: {outcome.message}; retrying in {RETRY:.0f}s"
        before = c.get(conds, c.Type.ADDONS_READY)
        if before is None or before.reason != reason:
            events.emit(obj, reason, msg, warning=True)
        log.warning("add-ons of %s/%s: %s", namespace, cluster_name, msg)
        conds = c.set_condition(conds, c.Type.ADDONS_READY, False, reason, msg, now, gen)
        return Phase(conds, AddonsStatus.model_validate(obj.get("status", {}).get("addons") or {}), RETRY)
    msg = f"dra-driver-nvidia-gpu {version}, gate driver, claim templates in {', '.join(request.claim_namespaces)}"
    msg += f" ({outcome.changed} changed)"
    if outcome.changed:
        events.emit(obj, str(c.Reason.ADDONS_INSTALLED), msg)
    applied = AddonsStatus(
        applied_digest=digest,
        chart_version=request.chart_version if request.manage_dra_driver else None,
        applied_time=now,
    )
    conds = c.set_condition(conds, c.Type.ADDONS_READY, True, c.Reason.ADDONS_INSTALLED, msg, now, gen)
    return Phase(conds, applied, REFRESH.total_seconds())
