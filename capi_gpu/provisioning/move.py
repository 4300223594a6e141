"""What a host carries through ``clusterctl move``, and when a move must wait. Pure.

clusterctl creates every moved object without its status, and moves a HetznerGPUHost (no owner) before the
HetznerGPUMachine that consumes it. Status is the host's only memory of what was done to the server (the
pinned OS host key, the inspected disks, the operations recorded before they were sent), and none of it can
be rediscovered without a rescue boot. So the status, less its derived conditions, is mirrored into an
annotation before every status write, and a host that arrives without status is restored from it (Metal3's
``baremetalhost.metal3.io/status`` does the same). The mirror is written first, so it never knows less
than status did: a restored host treats everything recorded as sent, as a restarted controller does.

While a destructive operation is recorded and its step not yet confirmed (rescue armed and reset sent but
rescue not reached, installimage running, a reboot sent but the OS not answering), the host carries
``clusterctl.cluster.x-k8s.io/block-move`` and keeps running to the end of that step even when paused; a
move waits for it instead of cutting the step in half.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum

from capi_gpu.api.host import ErrorType, HetznerGPUHostStatus, HostKeys, HostState
from capi_gpu.api.network import VSwitchMembership
from capi_gpu.provisioning.model import DESTRUCTIVE
from capi_gpu.provisioning.transitions import DEFERRED, NOT_SENT, PIPELINE_STATES

_DESTRUCTIVE_NAMES = frozenset(kind.value for kind in DESTRUCTIVE)


class Reason(StrEnum):
    """Condition reasons of a host waiting on something a move has not delivered yet."""

    CONSUMER_MISSING = "ConsumerMissing"  # consumerRef names a HetznerGPUMachine that does not exist (yet)
    CONSUMER_CHANGED = "ConsumerChanged"  # refreshing a moved consumer's uid lost a race; retried
    OS_HOST_KEY_MISSING = "OSHostKeyMissing"  # a key is pinned but its Secret is not there (yet)
    STATUS_SNAPSHOT_INVALID = "StatusSnapshotInvalid"  # the status annotation does not parse
    STATUS_SNAPSHOT_UNTRUSTED = "StatusSnapshotUntrusted"  # it disagrees with Robot or the pinned key's Secret
    STATUS_SNAPSHOT_UNCHECKED = "StatusSnapshotUnchecked"  # Robot did not answer: not restored yet


def snapshot(status: HetznerGPUHostStatus) -> str:
    """The annotation value: status without conditions (derived, so rebuilt), compact and stable."""
    body = status.model_dump(by_alias=True, mode="json", exclude={"conditions"}, exclude_defaults=True)
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def restore(text: str) -> HetznerGPUHostStatus:
    """The status a snapshot holds; ``ValueError`` (pydantic's ValidationError is one) when it is not one."""
    body = json.loads(text)
    if not isinstance(body, dict):
        raise ValueError("status snapshot is not an object")
    return HetznerGPUHostStatus.model_validate(body)


def untrusted(status: HetznerGPUHostStatus, robot_ip: str | None, pinned_os_key: str | None) -> list[str]:
    """Why a restored snapshot must not be believed; empty when it may.

    Anyone who may create a HetznerGPUHost writes the annotation, so it is trusted only as far as it can be
    checked: the address against what Robot says for the server number (the operator would SSH there with
    the namespace's key and send bootstrap data), the OS host key against the pinned key's Secret owned by
    this host's uid (``pinned_os_key``; None when there is none yet: a move delivers the Secret after its
    host, and the host loop waits for it and pins the Secret's key, never the snapshot's)."""
    out = []
    if status.ipv4 is not None and status.ipv4 != robot_ip:
        out.append(f"ipv4 {status.ipv4} is not Robot's address for the server ({robot_ip or 'none'})")
    if (
        pinned_os_key is not None
        and status.host_keys.os is not None
        and _key(status.host_keys.os) != _key(pinned_os_key)
    ):
        out.append("hostKeys.os is not the key of the OS host key Secret owned by this host")
    return out


def rediscover(
    pinned_os_key: str | None, claimed: bool, doubts: list[str], now: datetime, lever: str
) -> HetznerGPUHostStatus:
    """The status an untrusted snapshot leaves: nothing of it, and nothing done to the server for it.

    A claimed host registers again: Registering reads the address from Robot, and a claimed host whose
    installed OS answers there with the pinned key (and its name) is adopted without a reset; otherwise it
    waits for its OS or a human, never a rescue boot. An unclaimed host would go on to inspection, which
    boots it into rescue: a forged annotation must not order that, so it waits in a permanent error until a
    human removes ``lever`` (the permanent-error annotation) and so asks for the inspection."""
    if claimed:
        return HetznerGPUHostStatus(host_keys=HostKeys(os=pinned_os_key))
    message = (
        f"status snapshot not restored: {'; '.join(doubts)}; the server was not touched. Remove the annotation "
        f"{lever} to register and inspect it again (inspection boots it into rescue)"
    )
    return HetznerGPUHostStatus(
        host_keys=HostKeys(os=pinned_os_key),
        state=HostState.ERROR,
        error_type=ErrorType.REGISTRATION,
        error_permanent=True,
        error_count=1,
        error_message=message[:2000],
        last_error_at=now,
    )


def _key(line: str | None) -> tuple[str, ...]:
    return tuple((line or "").split()[:2])  # type and blob; the comment is not the key


def status_lost(raw_status: object) -> bool:
    """The object came without status: created by clusterctl move (or by hand), never reconciled here."""
    return not isinstance(raw_status, dict) or not raw_status.get("state")


def in_flight(status: HetznerGPUHostStatus) -> bool:
    """A destructive operation is recorded in the current step and the step has not been confirmed yet."""
    if status.state not in PIPELINE_STATES and status.state is not HostState.DEPROVISIONING:
        return False
    since = status.step_started_at
    return any(
        op.name in _DESTRUCTIVE_NAMES
        and op.outcome not in (DEFERRED, NOT_SENT)
        and not (op.outcome or "").startswith("Failed")
        and (since is None or op.requested_at >= since)
        for op in status.operations
    )


def deleted_status(status: HetznerGPUHostStatus, raw_status: object, snapshot_text: str | None) -> HetznerGPUHostStatus:
    """What a host being deleted holds: its status, or, when it arrived by a move without status and was not
    restored yet (``raw_status`` as the object carries it), its status snapshot where that parses."""
    if not status_lost(raw_status) or not snapshot_text:
        return status
    try:
        return restore(snapshot_text)
    except ValueError:
        return status


def deletion_refused(status: HetznerGPUHostStatus, consumer: str | None, moving: bool) -> str | None:
    """Why a HetznerGPUHost must not be deleted now (None: it may), with what to do. A clusterctl move's delete
    (``moving``) always may: the host lives on in the target cluster, record and claim with it.

    A host in use (``consumer``) goes with its Machine. A host holding a private network record
    (``status.privateNetwork``: released but still leaving the vSwitch, or joined) would take the record with
    it: the server stays on the vSwitch with its address, and the allocator, which counts only the addresses
    hosts record, hands that address to another host."""
    if moving:
        return None
    if consumer is not None:
        return f"in use by {consumer}; delete the Machine first"
    record = status.private_network
    if record is None:
        return None
    held = f"holds {record.address} on vSwitch {record.vswitch_id} (membership {record.membership.value})"
    if record.membership is VSwitchMembership.LEAVING:
        todo = "wait: the record is dropped once Robot shows the server off the vSwitch, then delete"
    else:
        todo = (
            "wait for Deprovisioning to take the server off the vSwitch (the record is then dropped), or remove "
            "the server from the vSwitch in Robot and clear status.privateNetwork, then delete"
        )
    return (
        f"{held}: deleting it now would leave the server on the vSwitch and free its address for another host; {todo}"
    )
