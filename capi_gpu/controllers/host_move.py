"""The host loop's side of clusterctl move and pause: the annotations written before each status write
(status snapshot, block-move, permanent error), restoring a host that arrived without status, and the
one write a paused host makes (its ``Paused`` condition). The decisions are in ``provisioning.move``.
"""

from __future__ import annotations

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.base import Condition
from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostStatus
from capi_gpu.controllers.host_context import HOSTS, hostname, owned_by
from capi_gpu.hetzner import errors as robot_errors
from capi_gpu.kube import SECRETS, Obj
from capi_gpu.provisioning import move
from capi_gpu.runtime import events
from capi_gpu.runtime.deps import AccessError, Deps, secret_value


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


# A snapshot Robot can't check yet is usually a move still delivering the Robot credentials Secret after the
# hosts: look again soon, since the host has no state (and its node no gate verdict) until then.
UNCHECKED_RETRY_S, INVALID_RETRY_S = 10.0, 60.0


async def restore(deps: Deps, obj: Obj, host: HetznerGPUHost) -> HetznerGPUHost | float:
    """A host that arrived without status (clusterctl move) gets its status back from the snapshot, as far as
    it can be checked (``move.untrusted``): one that disagrees with Robot or the pinned key's Secret is
    dropped (``move.rediscover``: a claimed host registers again, an unclaimed one waits for a human before
    any inspection). When the snapshot is unreadable or Robot can't check it yet, only a condition is
    written, nothing is done to the server, and the seconds until the next try are returned."""
    text = annotations_of(obj).get(domain.ANNOTATION_STATUS)
    if text is None:
        return host  # never reconciled anywhere: a new host
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    try:
        status = move.restore(text)
    except ValueError as exc:
        msg = f"annotation {domain.ANNOTATION_STATUS} is not a host status ({str(exc)[:300]}); fix or remove it"
        await _not_restored(deps, obj, host, move.Reason.STATUS_SNAPSHOT_INVALID, msg)
        return INVALID_RETRY_S
    sources = await _sources(deps, host, ns)
    if isinstance(sources, str):
        await _not_restored(deps, obj, host, move.Reason.STATUS_SNAPSHOT_UNCHECKED, sources)
        return UNCHECKED_RETRY_S
    robot_ip, pinned = sources
    if doubts := move.untrusted(status, robot_ip, pinned):
        claimed = host.spec.consumer_ref is not None
        status = move.rediscover(pinned, claimed, doubts, deps.clock(), domain.ANNOTATION_PERMANENT_ERROR)
        then = (
            "registering again from Robot, without a reset"
            if claimed
            else f"held in a permanent error, the server untouched, until the annotation "
            f"{domain.ANNOTATION_PERMANENT_ERROR} is removed"
        )
        events.emit(
            obj, move.Reason.STATUS_SNAPSHOT_UNTRUSTED, f"status snapshot not restored: {'; '.join(doubts)}; {then}",
            warning=True,
        )  # fmt: skip
        # The lever first, as every permanent error writes it: this pass must see it set, or it would read the
        # missing annotation as a human's release and inspect at once.
        host = versioned(host, await write_annotations(deps, obj, host, status))
    written = await deps.kube.patch(
        HOSTS, name, {"status": status.model_dump(by_alias=True, mode="json")}, ns, sub="status"
    )
    if not doubts:
        step = f"/{status.step.value}" if status.step else ""
        events.emit(obj, "StatusRestored", f"status restored from its snapshot: {status.state.value}{step}")
    # Later writes this pass (a consumer uid refresh) carry a resourceVersion precondition: the new one.
    obj["metadata"]["resourceVersion"] = written["metadata"]["resourceVersion"]
    meta = {**host.metadata, "resourceVersion": written["metadata"]["resourceVersion"]}
    return host.model_copy(update={"status": status, "metadata": meta})


def versioned(host: HetznerGPUHost, written: Obj | None) -> HetznerGPUHost:
    """``host`` carrying the resourceVersion of our own latest write, so the next write's precondition holds."""
    version = ((written or {}).get("metadata") or {}).get("resourceVersion")
    if version is None:
        return host
    return host.model_copy(update={"metadata": {**host.metadata, "resourceVersion": version}})


async def _not_restored(deps: Deps, obj: Obj, host: HetznerGPUHost, reason: str, msg: str) -> None:
    """Only a condition (and, once per cause, an Event); nothing is done to the server. No state in this
    write, so the host still counts as "arrived without status" next pass and is tried again."""
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    before = c.get(host.status.conditions, c.Type.READY)
    if before is not None and (before.status, before.reason, before.message) == ("False", reason, msg):
        return  # said already: tried again every 10 s, it must not rewrite the same condition each time
    conds = c.set_condition([], c.Type.READY, False, reason, msg, deps.clock())
    await deps.kube.patch(HOSTS, name, {"status": _conditions_body(conds)}, ns, sub="status")
    if before is None or before.reason != reason:
        events.emit(obj, reason, msg, warning=True)


async def _sources(deps: Deps, host: HetznerGPUHost, ns: str) -> tuple[str | None, str | None] | str:
    """What a snapshot is checked against: Robot's address for the server number (None: not in the account)
    and the public key of the OS host key Secret owned by this host (None: no such Secret yet). A string
    says why they can't be read now."""
    try:
        robot = await deps.robots.get(deps.kube, ns, host.spec.robot.credentials_secret)
        robot_ip: str | None = (await robot.cached_server(host.spec.server_number)).server_ip
    except AccessError as exc:
        return f"the snapshot is restored once Robot can check its address: {exc}"
    except robot_errors.RobotNotFound:
        robot_ip = None
    except robot_errors.RobotError as exc:
        return f"Robot did not answer ({type(exc).__name__}); the snapshot is restored once it can check its address"
    name = f"{hostname(host)}{domain.OS_HOSTKEY_SECRET_SUFFIX}"
    secret = await deps.kube.get_or_none(SECRETS, name, ns)
    if secret is None or not owned_by(secret, str(host.metadata.get("uid", ""))):
        return robot_ip, None  # the host loop waits for, or refuses, such a Secret before any SSH
    return robot_ip, secret_value(secret, "ssh-host-publickey", "OS host key")


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
