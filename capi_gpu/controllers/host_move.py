"""The host loop's side of clusterctl move and pause: the annotations written before each status write
(status snapshot, block-move, permanent error), restoring a host that arrived without status, and the
one write a paused host makes (its ``Paused`` condition). The decisions are in ``provisioning.move``.
"""

from __future__ import annotations

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.base import Condition
from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostStatus
from capi_gpu.controllers.host_context import HOSTS
from capi_gpu.kube import Obj
from capi_gpu.provisioning import move
from capi_gpu.runtime import events
from capi_gpu.runtime.deps import Deps


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def paused(obj: Obj) -> bool:
    return domain.PAUSED_ANNOTATION in annotations_of(obj)


def _conditions_body(conds: list[Condition]) -> dict[str, object]:
    return {"conditions": [x.model_dump(by_alias=True, mode="json") for x in conds]}


async def write_annotations(
    deps: Deps, obj: Obj, host: HetznerGPUHost, status: HetznerGPUHostStatus, acting: bool = False
) -> Obj | None:
    """Before the status write, in one patch: the permanent-error annotation (what a human removes to
    release the host), the status snapshot a move carries, and block-move while a destructive step is open
    or an action is about to run (``acting``: its outcome is written after the pass has run it, perhaps
    after a pause; clusterctl waits instead of moving the host mid-action, so no operator on either side
    starts the same step while this one still runs it). Carries the host's resourceVersion when it has one
    (host_loop's precondition); returns what was written."""
    current = annotations_of(obj)
    want: dict[str, str | None] = {}
    if status.error_permanent and not host.status.error_permanent:
        want[domain.ANNOTATION_PERMANENT_ERROR] = (status.error_type or "Error").replace("Error", "") or "Error"
    want[domain.ANNOTATION_STATUS] = move.snapshot(status)
    want[domain.BLOCK_MOVE_ANNOTATION] = "" if acting or move.in_flight(status) else None
    changed = {k: v for k, v in want.items() if current.get(k) != v and not (v is None and k not in current)}
    if not changed:
        return None
    meta = obj["metadata"]
    patch: Obj = {"annotations": changed}
    if (version := host.metadata.get("resourceVersion")) is not None:
        patch["resourceVersion"] = version
    written = await deps.kube.patch(HOSTS, meta["name"], {"metadata": patch}, meta["namespace"])
    merged = {**current, **changed}
    meta["annotations"] = {k: v for k, v in merged.items() if v is not None}
    return written


async def restore(deps: Deps, obj: Obj, host: HetznerGPUHost) -> HetznerGPUHost | None:
    """A host that arrived without status (clusterctl move) gets its status back from the snapshot. None
    when the snapshot is unreadable: then only a condition is written and nothing is done to the server."""
    text = annotations_of(obj).get(domain.ANNOTATION_STATUS)
    if text is None:
        return host  # never reconciled anywhere: a new host
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    try:
        status = move.restore(text)
    except ValueError as exc:
        reason = move.Reason.STATUS_SNAPSHOT_INVALID
        msg = f"annotation {domain.ANNOTATION_STATUS} is not a host status ({str(exc)[:300]}); fix or remove it"
        conds = c.set_condition([], c.Type.READY, False, reason, msg, deps.clock())
        # No state in this write, so the host still counts as "arrived without status" next pass.
        await deps.kube.patch(HOSTS, name, {"status": _conditions_body(conds)}, ns, sub="status")
        events.emit(obj, reason, msg, warning=True)
        return None
    written = await deps.kube.patch(
        HOSTS, name, {"status": status.model_dump(by_alias=True, mode="json")}, ns, sub="status"
    )
    step = f"/{status.step.value}" if status.step else ""
    events.emit(obj, "StatusRestored", f"status restored from its snapshot: {status.state.value}{step}")
    # Later writes this pass (a consumer uid refresh) carry a resourceVersion precondition: the new one.
    obj["metadata"]["resourceVersion"] = written["metadata"]["resourceVersion"]
    meta = {**host.metadata, "resourceVersion": written["metadata"]["resourceVersion"]}
    return host.model_copy(update={"status": status, "metadata": meta})


async def pause(deps: Deps, obj: Obj, host: HetznerGPUHost) -> float:
    """Paused with no destructive step open: drop block-move, say Paused once, and touch nothing else."""
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    if domain.BLOCK_MOVE_ANNOTATION in annotations_of(obj):
        await deps.kube.patch(HOSTS, name, {"metadata": {"annotations": {domain.BLOCK_MOVE_ANNOTATION: None}}}, ns)
    if not c.is_true(host.status.conditions, c.Type.PAUSED):
        conds = c.set_condition(
            host.status.conditions, c.Type.PAUSED, True, c.Reason.PAUSED, "Cluster or host is paused", deps.clock()
        )
        await deps.kube.patch(HOSTS, name, {"status": _conditions_body(conds)}, ns, sub="status")
    return deps.settings.timing.poll * 3


def paused_condition(status: HetznerGPUHostStatus, pausing: bool, deps: Deps) -> None:
    """A host that runs is not paused; one asked to pause mid-step says it is finishing that step first."""
    msg = "pause requested; finishing the in-flight step first (block-move set)" if pausing else ""
    status.conditions = c.set_condition(status.conditions, c.Type.PAUSED, False, c.Reason.NOT_PAUSED, msg, deps.clock())
