"""A HetznerGPUCluster's vSwitch (docs/private-network.md, steps 1 and 7): found, created or read, and
cancelled with the cluster when we created it.

``vswitch.vlan``: a vSwitch with that VLAN and our name is adopted, else the VLAN is checked against the
account's vSwitches (``vswitch_plan.check_create``: a VLAN in use is a condition, nothing sent) and the
vSwitch created; its id is written to ``status.privateNetwork`` as soon as Robot answers, before anything
else, so a restart never creates a second (and if that write is lost, or a move left the status behind, the
VLAN and name find it again). Before the create, the cluster records its intent in an annotation
(``ANNOTATION_VSWITCH_CREATE``): an adopted vSwitch counts as ours (``created``, cancelled with the cluster)
only with it, so a user's own vSwitch that happens to have our VLAN and name is used but never cancelled.
``vswitch.id``: read; a 404 is a condition. A cluster without ``spec.privateNetwork`` costs no vSwitch call.
"""

from __future__ import annotations

from dataclasses import dataclass

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.api.network import PrivateNetworkSpec, PrivateNetworkStatus
from capi_gpu.hetzner import errors as robot_errors
from capi_gpu.hetzner import models, vswitch_plan
from capi_gpu.hetzner.robot import RobotClient
from capi_gpu.kube import Obj, ours
from capi_gpu.runtime import events
from capi_gpu.runtime.deps import AccessError, Deps

CLUSTERS = ours("hetznergpuclusters")
CREATE_REST_S = 600.0  # after Robot refused a create for good, before it is asked again


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str
    message: str
    status: PrivateNetworkStatus | None


def vswitch_name(spec: PrivateNetworkSpec, obj: Obj) -> str:
    """``vswitch.name``, else the HetznerGPUCluster's name (stable from the first pass, unlike an owner)."""
    return spec.vswitch.name or str(obj["metadata"]["name"])


def ours_by_vlan(vswitches: list[models.VSwitch], vlan: int, name: str) -> models.VSwitch | None:
    """The vSwitch a lost record points at: not cancelled, our VLAN and our name. Another name on our VLAN is
    someone else's (``check_create`` refuses it as VLANInUse)."""
    return next((v for v in vswitches if v.vlan == vlan and v.name == name and not v.cancelled), None)


async def ensure(deps: Deps, hgc: HetznerGPUCluster, obj: Obj) -> Outcome | None:
    """The cluster's vSwitch, as the status should record it; None without ``spec.privateNetwork``."""
    spec = hgc.spec.private_network
    if spec is None:
        return None
    ns = obj["metadata"]["namespace"]
    status = (hgc.status.private_network or PrivateNetworkStatus()).model_copy()
    try:
        robot = await deps.robots.get(deps.kube, ns, hgc.spec.robot_credentials.name)
        if spec.vswitch.id is not None:
            status.vswitch_id, status.created = spec.vswitch.id, False
        elif status.vswitch_id is None:
            refused = await _find_or_create(deps, robot, spec, obj, status)
            if refused is not None:
                return Outcome(False, refused.reason.value, refused.message, hgc.status.private_network)
        assert status.vswitch_id is not None
        vswitch = await robot.cached_vswitch(status.vswitch_id)
    except AccessError as exc:
        return Outcome(False, exc.reason, str(exc), hgc.status.private_network)
    except robot_errors.RobotNotFound as exc:
        msg = f"vSwitch {status.vswitch_id} not found in Robot ({exc}): name an existing vSwitch by id, or a VLAN"
        return Outcome(False, c.Reason.VSWITCH_NOT_FOUND, msg, hgc.status.private_network)
    except (robot_errors.RobotRequeue, robot_errors.RobotTransientError, robot_errors.RobotAuthError) as exc:
        return Outcome(False, c.Reason.ROBOT_UNAVAILABLE, f"vSwitch: {exc}", status)
    except robot_errors.RobotTerminalError as exc:
        return Outcome(False, c.Reason.VSWITCH_REFUSED, f"vSwitch: Robot refused: {exc}", status)
    status.vlan, status.servers = vswitch.vlan, len(vswitch.server)
    if vswitch.cancelled:
        msg = f"vSwitch {vswitch.id} is cancelled: name another, or let the cluster create one with a VLAN"
        return Outcome(False, vswitch_plan.Refusal.VSWITCH_CANCELLED.value, msg, status)
    return Outcome(
        True, c.Reason.READY, f"vSwitch {vswitch.id} (VLAN {vswitch.vlan}), {len(vswitch.server)} servers", status
    )


async def _find_or_create(
    deps: Deps, robot: RobotClient, spec: PrivateNetworkSpec, obj: Obj, status: PrivateNetworkStatus
) -> vswitch_plan.Verdict | None:
    vlan, name = spec.vswitch.vlan, vswitch_name(spec, obj)
    assert vlan is not None
    rest = robot.account.vswitch_create_rest.get(vlan)
    if rest is not None and robot.account.clock() < rest[0]:
        # Robot refused this create for good (VSWITCH_LIMIT_REACHED: the account's vSwitches, which no read
        # shows): the same request every pass would spend a vSwitch write token (100/h) each time.
        raise robot_errors.RobotTerminalError(409, "RESTING", f"not asked again for a while: {rest[1]}")
    existing = await robot.list_vswitches()
    found = ours_by_vlan(existing, vlan, name)
    meta = obj["metadata"]
    intent = (meta.get("annotations") or {}).get(domain.ANNOTATION_VSWITCH_CREATE) == str(vlan)
    if found is not None and not intent:
        events.emit(
            obj,
            "VSwitchAdopted",
            f"vSwitch {found.id} {name!r} on VLAN {vlan} existed before this cluster asked for one: it is used, "
            "and never cancelled with the cluster",
        )
    if found is None:
        refused = vswitch_plan.check_create(vlan, existing)
        if refused is not None:
            return refused
        if not intent:  # recorded before the create: a crash after Robot's answer still finds it ours
            ann = {"metadata": {"annotations": {domain.ANNOTATION_VSWITCH_CREATE: str(vlan)}}}
            await deps.kube.patch(CLUSTERS, meta["name"], ann, meta["namespace"])
            intent = True
        try:
            found = await robot.create_vswitch(name, vlan)
        except robot_errors.RobotTerminalError as exc:
            if not isinstance(exc, robot_errors.RobotAuthError):
                robot.account.vswitch_create_rest[vlan] = (robot.account.clock() + CREATE_REST_S, str(exc))
            raise
        events.emit(obj, "VSwitchCreated", f"vSwitch {found.id} {name!r} on VLAN {vlan}")
    status.vswitch_id, status.vlan, status.created = found.id, found.vlan, intent
    # Recorded now, before anything else can fail: a restart reads the id instead of creating a second.
    body = {"status": {"privateNetwork": status.model_dump(by_alias=True, mode="json")}}
    await deps.kube.patch(CLUSTERS, meta["name"], body, meta["namespace"], sub="status")
    return None


async def release(deps: Deps, hgc: HetznerGPUCluster, obj: Obj) -> tuple[bool, str]:
    """Cluster deletion: cancel a vSwitch we created once its members have left. (done, what happens)."""
    spec, status = hgc.spec.private_network, hgc.status.private_network
    if spec is None or status is None or not status.created or status.vswitch_id is None:
        return True, "no vSwitch of ours"  # one named by id is never cancelled
    ns, vid = obj["metadata"]["namespace"], status.vswitch_id
    try:
        robot = await deps.robots.get(deps.kube, ns, hgc.spec.robot_credentials.name)
        robot.forget_vswitch(vid)
        vswitch = await robot.cached_vswitch(vid)
        if vswitch.cancelled:
            return True, f"vSwitch {vid} already cancelled"
        if vswitch.server:
            return False, f"vSwitch {vid}: waiting for its {len(vswitch.server)} servers to leave before cancelling it"
        await robot.cancel_vswitch(vid)
    except robot_errors.RobotNotFound:
        return True, f"vSwitch {vid} is gone"
    except (AccessError, robot_errors.RobotError) as exc:
        return False, f"vSwitch {vid} not cancelled yet: {exc}"
    events.emit(obj, "VSwitchCancelled", f"vSwitch {vid} cancelled with the cluster")
    return True, f"vSwitch {vid} cancelled"
