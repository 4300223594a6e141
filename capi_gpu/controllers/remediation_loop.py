"""HetznerGPURemediation: MachineHealthCheck's external remediation, by Robot hardware reset.

As in CAPH: reset the server, prove the reboot by a changed Node boot id, wait for the node to be
healthy again, retry up to ``retryLimit`` (0: no reset at all), then hand the Machine back to its owner
as the MachineHealthCheck external-remediation contract says: ``OwnerRemediated=False`` on the Machine,
and its MachineSet (or control plane) deletes and replaces it; we never delete it ourselves. Reuse: the
host returns to the pool; Retire: it is never chosen again. The reset is recorded in status (retryCount, lastRemediated,
bootIDBefore) before it is sent, so a restarted controller waits for it instead of resetting twice.
A cooldown stops a flapping host from being reset over and over.

``clusterctl move`` carries a remediation (owned by its Machine) without its status, and a remediation that
started over on the target would reset a server already rebooting, or read the host's moved
``last-remediated`` annotation as a cooldown and replace the Machine. So, as hosts do, the status (less
conditions) is mirrored into the ``status`` annotation before every status write and restored from it when
the object arrives without status: the target goes on waiting for the reset the source sent. Forging the
annotation gains nothing that creating a remediation does not already: at most the resets its spec allows.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from typing import Any

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.host import HetznerGPUHost, HostState
from capi_gpu.api.remediation import (
    HetznerGPURemediation,
    HetznerGPURemediationStatus,
    OnExhaustion,
    RemediationPhase,
)
from capi_gpu.controllers.host_context import HOSTS, MACHINES
from capi_gpu.hetzner import errors as robot_errors
from capi_gpu.hetzner import models as robot_models
from capi_gpu.kube import CAPI_MACHINES, NODES, Obj, ours
from capi_gpu.provisioning import move
from capi_gpu.runtime import events, loops, pause, workload
from capi_gpu.runtime.deps import AccessError, Deps

log = logging.getLogger(__name__)

REMEDIATIONS = ours("hetznergpuremediations")
MANAGER = "capi-gpu-remediation"
OWNER_REMEDIATED = "OwnerRemediated"


async def _node(deps: Deps, namespace: str, cluster: str, node_name: str) -> Obj | None:
    try:
        kube = await workload.client(deps, namespace, cluster)
    except workload.UnsafeKubeconfig:
        return None  # never loaded; the HetznerGPUCluster's WorkloadKubeconfigValid says why
    if kube is None:
        return None
    try:
        return await asyncio.to_thread(kube.get_or_none, NODES, node_name)
    finally:
        kube.close()


async def _node_of(deps: Deps, namespace: str, cluster: str, provider_id: str) -> tuple[bool, Obj | None]:
    """(reached, the workload cluster's Node with ``provider_id``): for a Machine CAPI has not given its nodeRef
    yet. Not reached (no kubeconfig yet, a refused one, an error): the caller waits."""
    try:
        kube = await workload.client(deps, namespace, cluster)
    except workload.UnsafeKubeconfig:
        return False, None
    if kube is None:
        return False, None
    try:
        nodes = await asyncio.to_thread(kube.list, NODES)
    except Exception as exc:  # the workload apiserver is not ours to judge: try again, replace nothing
        log.info("remediation: nodes of %s/%s not read: %s", namespace, cluster, exc)
        return False, None
    finally:
        kube.close()
    return True, next((n for n in nodes if (n.get("spec") or {}).get("providerID") == provider_id), None)


def _healthy(node: Obj | None, boot_before: str | None) -> bool:
    if node is None:
        return False
    status = node.get("status") or {}
    boot = (status.get("nodeInfo") or {}).get("bootID")
    conds = {x.get("type"): x.get("status") for x in status.get("conditions", [])}
    return boot != boot_before and conds.get("Ready") == "True" and conds.get(domain.GPU_READY_CONDITION) != "False"


async def _host_of(deps: Deps, namespace: str, capi: Obj) -> HetznerGPUHost | str | None:
    """The Machine's host; None when it never had one; a string when it can't be judged yet: mid-move, the
    HetznerGPUMachine or the host may not have arrived, or the host not have its status back from its
    snapshot. Judged then, a healthy host would read as "not provisioned" and its Machine be replaced."""
    ref = (capi.get("spec") or {}).get("infrastructureRef") or {}
    hgm = await deps.kube.get_or_none(MACHINES, ref.get("name", ""), namespace)
    if hgm is None:
        return f"HetznerGPUMachine {ref.get('name')} not found (yet)"
    host_name = (hgm["metadata"].get("annotations") or {}).get(domain.ANNOTATION_HOST)
    if not host_name:
        return None
    host = await deps.kube.get_or_none(HOSTS, host_name, namespace)
    if host is None or move.status_lost(host.get("status")):
        return f"HetznerGPUHost {host_name} not found or without status (yet)"
    return HetznerGPUHost.model_validate(host)


async def _reset(deps: Deps, host: HetznerGPUHost, namespace: str) -> str | None:
    """Robot hw reset through the host's account; returns an error message or None."""
    try:
        robot = await deps.robots.get(deps.kube, namespace, host.spec.robot.credentials_secret)
        await robot.reset(host.spec.server_number, robot_models.ResetType.HARDWARE)
    except (AccessError, robot_errors.RobotError) as exc:
        return str(exc)
    return None


async def reconcile(deps: Deps, namespace: str, name: str) -> float | None:
    obj = await deps.kube.get_or_none(REMEDIATIONS, name, namespace)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    rem = _restored(HetznerGPURemediation.model_validate(obj), obj)
    owner = next((o for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == "Machine"), None)
    capi = await deps.kube.get_or_none(CAPI_MACHINES, owner["name"], namespace) if owner else None
    st, now = rem.status.model_copy(deep=True), deps.clock()
    if capi is None or capi["metadata"].get("deletionTimestamp"):
        # MachineHealthCheck also asks to remediate a Machine that is already being deleted (a scale-down
        # deletes its Node first: NodeDeleted). It goes anyway and takes this object with it; a reset or a
        # "replace" would only be a false alarm.
        return None
    cluster = capi["spec"]["clusterName"]
    if await pause.paused(deps, namespace, obj, cluster):
        conds = pause.condition(st.conditions, True, now, obj["metadata"].get("generation"))
        if [x.model_dump() for x in conds] != [x.model_dump() for x in st.conditions]:
            body = {"conditions": [x.wire() for x in conds]}
            await deps.kube.patch(REMEDIATIONS, name, {"status": body}, namespace, sub="status")
        return 30.0
    st.conditions = pause.condition(st.conditions, False, now, obj["metadata"].get("generation"))
    host = await _host_of(deps, namespace, capi)
    if isinstance(host, str):
        return 10.0  # e.g. a move still delivering it: wait, write nothing, send nothing
    node_name = ((capi.get("status") or {}).get("nodeRef") or {}).get("name")
    if not node_name and st.phase is RemediationPhase.WAITING:
        # A reset in flight, restored on the target of a move: clusterctl created the Machine without status,
        # and CAPI sets its nodeRef again a little later. Without it the node can't be judged; wait for it.
        return 10.0
    provider_id = str((capi.get("spec") or {}).get("providerID") or "")
    if not node_name and provider_id and host is not None and host.status.state is HostState.PROVISIONED:
        # Not started yet, and the Machine has no nodeRef: on a move's target (a remediation the MHC made just
        # before the pause) CAPI has not set it again yet. Its node, found by providerID, is the one to judge;
        # only a node that never joined (none with that providerID) hands the Machine back to be replaced.
        reached, node = await _node_of(deps, namespace, cluster, provider_id)
        if not reached:
            return 10.0
        node_name = node["metadata"]["name"] if node is not None else None
    st, note = await _advance(deps, rem, st, host, capi, obj, node_name)
    if st.phase is RemediationPhase.DELETING_MACHINE:
        await _owner_remediate(deps, capi, namespace, note[1] if note else "remediation gave up", now)
    st.conditions = c.set_condition(
        st.conditions,
        c.Type.READY,
        st.phase is RemediationPhase.SUCCEEDED,
        (st.phase or RemediationPhase.RUNNING).value,
        note[1] if note else "",
        now,
    )
    if st.model_dump() != rem.status.model_dump() or not (obj.get("status") or {}).get("phase"):
        await _write_status(deps, obj, st)
    if note:
        events.emit(obj, note[0], note[1], note[2])
    return None if st.phase in (RemediationPhase.SUCCEEDED, RemediationPhase.DELETING_MACHINE) else 10.0


Note = tuple[str, str, bool]


async def _advance(
    deps: Deps,
    rem: HetznerGPURemediation,
    st: HetznerGPURemediationStatus,
    host: HetznerGPUHost | None,
    capi: Obj,
    obj: Obj,
    node_name: str | None,
) -> tuple[Any, Note | None]:
    """The next step of the remediation, by its phase."""
    namespace, cluster = obj["metadata"]["namespace"], capi["spec"]["clusterName"]
    if host is None or host.status.state is not HostState.PROVISIONED or not node_name:
        st.phase = RemediationPhase.DELETING_MACHINE
        why = "host not provisioned; handing the Machine back to its owner to replace"
        return st, ("RemediationImpossible", why, True)
    if st.phase in (None, RemediationPhase.RUNNING) and st.retry_count == 0:
        if rem.spec.strategy.retry_limit == 0:
            return await _exhausted(deps, rem, host, namespace, st)
        return await _first(deps, rem, host, namespace, cluster, node_name, obj)
    if st.phase is RemediationPhase.WAITING:
        return await _waiting(deps, rem, host, namespace, cluster, node_name, obj)
    return st, None


async def _first(
    deps: Deps, rem: HetznerGPURemediation, host: HetznerGPUHost, namespace: str, cluster: str, node_name: str, obj: Obj
) -> tuple[Any, Note]:
    cooldown = _last_remediated(host)
    if cooldown and deps.clock() - cooldown < dt.timedelta(seconds=rem.spec.strategy.cooldown_seconds):
        st = rem.status.model_copy(deep=True)
        st.phase = RemediationPhase.DELETING_MACHINE
        return st, ("RemediationCooldown", "reset within the cooldown; replacing the Machine instead", True)
    return await _send(deps, rem, host, namespace, cluster, node_name, obj)


async def _waiting(
    deps: Deps, rem: HetznerGPURemediation, host: HetznerGPUHost, namespace: str, cluster: str, node_name: str, obj: Obj
) -> tuple[Any, Note | None]:
    st, strat, now = rem.status.model_copy(deep=True), rem.spec.strategy, deps.clock()
    node = await _node(deps, namespace, cluster, node_name)
    waited = (now - (st.last_remediated or now)).total_seconds()
    if _healthy(node, st.boot_id_before):
        st.phase = RemediationPhase.SUCCEEDED
        return st, ("Remediated", f"node back after {waited:.0f}s (new boot id)", False)
    if waited <= strat.timeout_seconds:
        return st, None
    if st.retry_count < strat.retry_limit:
        return await _send(deps, rem, host, namespace, cluster, node_name, obj)
    return await _exhausted(deps, rem, host, namespace, st)


async def _exhausted(
    deps: Deps, rem: HetznerGPURemediation, host: HetznerGPUHost, namespace: str, st: Any = None
) -> tuple[Any, Note]:
    """No (more) resets: Retire takes the host out of the pool; either way the Machine goes back to its owner."""
    st = st if st is not None else rem.status.model_copy(deep=True)
    strat = rem.spec.strategy
    st.phase = RemediationPhase.DELETING_MACHINE
    if strat.on_exhaustion is OnExhaustion.RETIRE:
        await deps.kube.patch(HOSTS, str(host.metadata["name"]), {"spec": {"retired": True}}, namespace)
    return st, ("RemediationExhausted", f"{st.retry_count} reset(s) did not help; {strat.on_exhaustion.value}", True)


async def _owner_remediate(deps: Deps, capi: Obj, namespace: str, message: str, now: dt.datetime) -> None:
    """``OwnerRemediated=False`` on the Machine (server-side apply owns just that condition): the MHC
    external-remediation contract's way to say "replace it"; the MachineSet deletes it, we do not."""
    meta = capi["metadata"]
    previous = next(
        (x for x in (capi.get("status") or {}).get("conditions", []) if x.get("type") == OWNER_REMEDIATED), None
    )
    since = previous["lastTransitionTime"] if previous and previous.get("status") == "False" else now.isoformat()
    cond = {
        "type": OWNER_REMEDIATED,
        "status": "False",
        "reason": "WaitingForRemediation",
        "message": message[:1000],
        "lastTransitionTime": since,
        "observedGeneration": int(meta.get("generation", 1)),
    }
    body = {
        "apiVersion": domain.CAPI_API_VERSION,
        "kind": "Machine",
        "metadata": {"name": meta["name"], "namespace": namespace},
        "status": {"conditions": [cond]},
    }
    await deps.kube.apply_patch(CAPI_MACHINES, meta["name"], body, MANAGER, namespace, sub="status")


def _last_remediated(host: HetznerGPUHost) -> dt.datetime | None:
    raw: Any = host.metadata.get("annotations") or {}
    value = raw.get(f"{domain.DOMAIN}/last-remediated")
    return dt.datetime.fromisoformat(value) if value else None


async def _send(
    deps: Deps, rem: HetznerGPURemediation, host: HetznerGPUHost, namespace: str, cluster: str, node_name: str, obj: Obj
) -> tuple[Any, tuple[str, str, bool]]:
    st = rem.status.model_copy(deep=True)
    node = await _node(deps, namespace, cluster, node_name)
    st.boot_id_before = ((node or {}).get("status", {}).get("nodeInfo") or {}).get("bootID")
    st.retry_count += 1
    st.last_remediated = deps.clock()
    st.phase = RemediationPhase.WAITING
    # Recorded before sending (snapshot included): a restart, or the target of a move, waits for this reset
    # instead of sending another.
    await _write_status(deps, obj, st)
    await deps.kube.patch(
        HOSTS,
        str(host.metadata["name"]),
        {"metadata": {"annotations": {f"{domain.DOMAIN}/last-remediated": st.last_remediated.isoformat()}}},
        namespace,
    )
    error = await _reset(deps, host, namespace)
    if error:
        return st, ("ResetFailed", f"Robot hw reset of server {host.spec.server_number} failed: {error}", True)
    return st, (
        "ResetSent",
        f"Robot hw reset {st.retry_count}/{rem.spec.strategy.retry_limit} of server {host.spec.server_number}",
        False,
    )


def _snapshot(st: HetznerGPURemediationStatus) -> str:
    body = st.model_dump(by_alias=True, mode="json", exclude={"conditions"}, exclude_defaults=True)
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _restored(rem: HetznerGPURemediation, obj: Obj) -> HetznerGPURemediation:
    """A remediation that arrived without status (clusterctl move) with the status its snapshot holds; an
    unreadable snapshot is ignored (the remediation starts over, as one created now would)."""
    text = (obj["metadata"].get("annotations") or {}).get(domain.ANNOTATION_STATUS)
    # "Without status" is without a phase: on the target the paused Cluster has this loop write its Paused
    # condition first, so the status is not empty by the time the move is done.
    if (obj.get("status") or {}).get("phase") or not text:
        return rem
    try:
        status = HetznerGPURemediationStatus.model_validate(json.loads(text))
    except ValueError:
        return rem
    return rem.model_copy(update={"status": status})


async def _write_status(deps: Deps, obj: Obj, st: HetznerGPURemediationStatus) -> None:
    """The snapshot annotation first, so it never knows less than status does; then status."""
    meta = obj["metadata"]
    name, namespace, snap = meta["name"], meta["namespace"], _snapshot(st)
    if (meta.get("annotations") or {}).get(domain.ANNOTATION_STATUS) != snap:
        mirror = {"metadata": {"annotations": {domain.ANNOTATION_STATUS: snap}}}
        await deps.kube.patch(REMEDIATIONS, name, mirror, namespace)
        meta["annotations"] = {**(meta.get("annotations") or {}), domain.ANNOTATION_STATUS: snap}
    body = {"status": st.model_dump(by_alias=True, mode="json")}
    await deps.kube.patch(REMEDIATIONS, name, body, namespace, sub="status")


async def run(deps: Deps, namespace: str, name: str, stopped: Any) -> None:
    await loops.run("remediation", reconcile, deps, namespace, name, stopped)
