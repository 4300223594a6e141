"""A host's life on its cluster's vSwitch, as pure decisions (docs/private-network.md, steps 2-6). No I/O.

Everything is decided from the host's own status, so a restarted controller resumes from it: the record
(``status.privateNetwork``: vSwitch, address, membership) is written before a join is sent, ``Leaving``
is written before a leave is sent, and the record is dropped only once Robot shows the server gone. Which
servers join or leave a vSwitch is read from every host's record (``desired``), so the one batched change
per vSwitch (``vswitch_plan.next_change``) is the same whichever host's pass sends it.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from capi_gpu.api.host import HetznerGPUHostStatus, HostState
from capi_gpu.api.network import VSwitchMembership
from capi_gpu.provisioning.model import ActionKind
from capi_gpu.provisioning.transitions import DEFERRED, INTERRUPTED, NOT_SENT

M = VSwitchMembership
# States in which a claim gets an address: on the way to provisioning.
_ALLOCATING = frozenset({HostState.AVAILABLE, HostState.STANDBY, HostState.PROVISIONING})


def reset_done(status: HetznerGPUHostStatus) -> bool:
    """kubeadm reset has an outcome in the current Deprovisioning step (a failed reset counts: it is best
    effort, and the next install resets the node anyway)."""
    since = status.step_started_at
    return any(
        op.name == ActionKind.KUBEADM_RESET.value
        and op.outcome is not None
        and op.outcome not in (DEFERRED, NOT_SENT, INTERRUPTED)
        and (since is None or op.requested_at >= since)
        for op in status.operations
    )


def should_leave(status: HetznerGPUHostStatus, wanted: int | None) -> bool:
    """Whether the host's server should leave the vSwitch its record names. ``wanted`` is the vSwitch its
    claim puts it on (None: no claim, or a cluster without a private network).

    Leaving is for good once written (``Leaving``). A released host leaves after kubeadm reset, never before:
    the node must stop talking on the private network first. A host that still holds its claim stays."""
    record = status.private_network
    if record is None:
        return False
    if record.membership is M.LEAVING:
        return True
    if status.state is HostState.DEPROVISIONING:
        return reset_done(status)
    if wanted == record.vswitch_id:
        return False
    # Released (or claimed elsewhere) while provisioned: Deprovisioning and its kubeadm reset come first.
    return status.state is not HostState.PROVISIONED


def should_allocate(status: HetznerGPUHostStatus, wanted: int | None) -> bool:
    """A claim on a private network and no record yet, in a state on the way to provisioning. Not while
    Deprovisioning (a record dropped after its leave must not come back before the host is released) and
    not for a host still leaving another vSwitch (its record names that one until the leave is done)."""
    return wanted is not None and status.private_network is None and status.state in _ALLOCATING


def desired(
    hosts: Iterable[Mapping[str, Any]], vswitch_id: int, paused: Container[tuple[str, str]] = frozenset()
) -> tuple[frozenset[int], frozenset[int]]:
    """The servers that should join and those that should leave ``vswitch_id``, from every host's record (as
    the API returns them, any namespace): a record that says ``Leaving`` leaves, any other joins. Hosts in
    ``paused`` ((namespace, name), ``on_vswitch`` lists whose pause to ask) are left out: their cluster is
    being moved, and clusters sharing a vSwitch by id must not send a change for its servers meanwhile."""
    join: set[int] = set()
    leave: set[int] = set()
    for host in hosts:
        record = (host.get("status") or {}).get("privateNetwork") or {}
        number = (host.get("spec") or {}).get("serverNumber")
        if record.get("vswitchID") != vswitch_id or not isinstance(number, int) or _key(host) in paused:
            continue
        (leave if record.get("membership") == M.LEAVING.value else join).add(number)
    return frozenset(join), frozenset(leave)


def _key(host: Mapping[str, Any]) -> tuple[str, str]:
    meta = host.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def on_vswitch(hosts: Iterable[Mapping[str, Any]], vswitch_id: int) -> list[Mapping[str, Any]]:
    """The hosts whose record names ``vswitch_id``: the ones whose pause ``desired`` needs."""
    return [h for h in hosts if ((h.get("status") or {}).get("privateNetwork") or {}).get("vswitchID") == vswitch_id]


@dataclass(frozen=True)
class Gates:
    """What the state machine waits for: Configure, the join (Bootstrap) and the end of Deprovisioning. None: no
    wait. ``configure`` is decided from the claim's cluster (it has ``spec.privateNetwork``), never from whether
    the interface is built yet: a standby host claimed before its cluster recorded the vSwitch still runs
    Configure again, which waits until the interface can be built."""

    before_join: str | None = None
    before_release: str | None = None
    before_configure: str | None = None  # why Configure waits: its VLAN interface can't be built yet
    configure: bool = False  # the claim's cluster has spec.privateNetwork: Configure writes its VLAN interface


def gates(status: HetznerGPUHostStatus, wanted: int | None) -> Gates:
    record = status.private_network
    before_join = None
    if wanted is not None:
        if record is None or record.vswitch_id != wanted:
            before_join = f"no address on vSwitch {wanted} yet"
        elif record.membership is not M.READY:
            before_join = (
                f"waiting for Robot to show the server ready on vSwitch {wanted} "
                f"(membership {record.membership.value}); the kubeadm join waits so the node registers its "
                f"private address {record.address}"
            )
    before_release = None
    if record is not None and status.state is HostState.DEPROVISIONING:
        before_release = (
            f"leaving vSwitch {record.vswitch_id} (membership {record.membership.value}); address "
            f"{record.address} is released once Robot shows the server gone"
        )
    return Gates(before_join, before_release)


def before_configure(status: HetznerGPUHostStatus, wanted: int | None, vlan: int | None) -> str | None:
    """Why Configure can't write the claim's VLAN interface yet (None: it can). ``wanted`` is the vSwitch the
    claim's cluster recorded, ``vlan`` its VLAN (the spec's, or the one the cluster read for a vSwitch named by
    id); None: not known yet. Configure without the interface would let kubeadm join with the public IP as
    the node's InternalIP, so it waits for the vSwitch, the host's address on it and the VLAN."""
    record = status.private_network
    if wanted is None:
        return "waiting for the cluster to record its vSwitch"
    if record is None or record.vswitch_id != wanted or record.membership is M.LEAVING:
        return f"no address on vSwitch {wanted} yet"
    if vlan is None:
        return f"waiting for the cluster to read the VLAN of vSwitch {wanted}"
    return None
