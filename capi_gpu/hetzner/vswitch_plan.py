"""vSwitch limits and membership decisions, checked before anything is sent to Robot. Pure: no I/O.

Robot enforces its vSwitch limits itself (409 ``VSWITCH_SERVER_LIMIT_REACHED`` and friends), but only
after a write token is spent (100/h for the whole account) and only with a code, not a reason a user
can act on. So the documented limits live here as data, and a requested change is checked against the
vSwitch as last read; a refusal carries a condition reason and a message that names the limit and the
fix. Robot's own 409s stay the backstop for what a read can't show (another tool's change in between).

Membership is asynchronous: after an add or a remove the server is ``processing`` and the vSwitch refuses
every change until it settles (409 ``VSWITCH_IN_PROCESS``). A change per host would therefore serialise
a scale-up behind each host's settle time, and spend one write token per host. ``next_change`` decides
for the whole vSwitch instead: one request carries every server that should join (``server[]``), or
every one that should leave; removals go first, because they free capacity the joins may need.

Documented limits (docs.hetzner.com/robot/dedicated-server/network/vswitch, ``reference/hetzner.md``):
VLAN IDs 4000-4091, 100 servers per vSwitch, 5 vSwitches per server, MTU 1400 on the VLAN interface.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from enum import StrEnum

from capi_gpu.api import network
from capi_gpu.hetzner.models import VSwitch, VSwitchServerStatus

VLAN_MIN, VLAN_MAX = network.VLAN_MIN, network.VLAN_MAX  # the spec's schema says the same range
SERVERS_PER_VSWITCH = 100
VSWITCHES_PER_SERVER = 5
MTU = network.MAX_MTU  # Hetzner requires 1400 on the VLAN interface


class Refusal(StrEnum):
    """Why a change is not sent. CamelCase: these are condition reasons."""

    VLAN_OUT_OF_RANGE = "VLANOutOfRange"
    VLAN_IN_USE = "VLANInUse"
    VSWITCH_FULL = "VSwitchFull"
    SERVER_VSWITCH_LIMIT = "ServerVSwitchLimit"
    VSWITCH_CANCELLED = "VSwitchCancelled"


@dataclass(frozen=True)
class Verdict:
    reason: Refusal
    message: str

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.message}"


def check_vlan(vlan: int) -> Verdict | None:
    if VLAN_MIN <= vlan <= VLAN_MAX:
        return None
    return Verdict(Refusal.VLAN_OUT_OF_RANGE, f"VLAN {vlan} is outside Robot's vSwitch range {VLAN_MIN}-{VLAN_MAX}")


def check_create(vlan: int, existing: Iterable[VSwitch]) -> Verdict | None:
    """A new vSwitch with this VLAN: in range, and unique among the account's vSwitches (cancelled ones
    keep theirs until they are gone)."""
    out_of_range = check_vlan(vlan)
    if out_of_range is not None:
        return out_of_range
    for other in existing:
        if other.vlan == vlan:
            return Verdict(
                Refusal.VLAN_IN_USE,
                f"VLAN {vlan} is already used by vSwitch {other.id} ({other.name!r}): name that vSwitch by id, "
                "or choose another VLAN",
            )
    return None


def memberships(vswitches: Iterable[VSwitch], server_number: int) -> int:
    """On how many of these vSwitches (read with their members) the server is, in any status."""
    return sum(v.member(server_number) is not None for v in vswitches)


def check_join(vswitch: VSwitch, servers: Iterable[int], memberships_of: Mapping[int, int]) -> Verdict | None:
    """Adding ``servers`` to ``vswitch``: not cancelled, room for all of them, and each server below its own
    limit. ``memberships_of`` is each server's count on *other* vSwitches; a server missing from it counts 0."""
    joining = [n for n in servers if vswitch.member(n) is None]
    if vswitch.cancelled:
        return Verdict(
            Refusal.VSWITCH_CANCELLED, f"vSwitch {vswitch.id} is cancelled: name another or let us create one"
        )
    total = len(vswitch.server) + len(joining)
    if total > SERVERS_PER_VSWITCH:
        return Verdict(
            Refusal.VSWITCH_FULL,
            f"vSwitch {vswitch.id} would hold {total} servers; Robot allows {SERVERS_PER_VSWITCH} per vSwitch",
        )
    for number in joining:
        if memberships_of.get(number, 0) >= VSWITCHES_PER_SERVER:
            return Verdict(
                Refusal.SERVER_VSWITCH_LIMIT,
                f"server {number} is already on {memberships_of[number]} vSwitches; Robot allows "
                f"{VSWITCHES_PER_SERVER} per server: remove it from one in Robot first",
            )
    return None


Membership = network.VSwitchMembership  # a host's status shows it, so the API owns the enum


def membership(vswitch: VSwitch, server_number: int, *, leaving: bool = False) -> Membership:
    """``leaving`` says whether we asked it to leave: Robot's ``processing`` is the same both ways."""
    entry = vswitch.member(server_number)
    if entry is None:
        return Membership.ABSENT
    if entry.status is VSwitchServerStatus.READY:
        return Membership.READY
    if entry.status is VSwitchServerStatus.FAILED:
        return Membership.FAILED
    return Membership.LEAVING if leaving else Membership.JOINING


class Action(StrEnum):
    NONE = "None"  # everyone is where they should be
    WAIT = "Wait"  # a member is processing: any change now is 409 VSWITCH_IN_PROCESS
    ADD = "Add"  # POST /vswitch/{id}/server with server[] = servers
    REMOVE = "Remove"  # DELETE /vswitch/{id}/server with server[] = servers


@dataclass(frozen=True)
class Change:
    """The one request to send now (or none), and the servers refused before anything was sent."""

    action: Action
    servers: tuple[int, ...] = ()
    refused: Mapping[int, Verdict] = field(default_factory=dict)


def next_change(
    vswitch: VSwitch, join: Set[int], leave: Set[int], memberships_of: Mapping[int, int] | None = None
) -> Change:
    """What to send to ``vswitch`` (as last read) so that ``join`` are on it and ``leave`` are not.

    A server in both is leaving (deprovision wins over a stale join). A ``failed`` member that should
    join is removed first, then added again on a later pass. Joins that would break a limit are
    refused one by one, in server-number order, so the ones that fit still go (deterministic: the
    same read gives the same request)."""
    counts = memberships_of or {}
    join = join - leave
    refused: dict[int, Verdict] = {}
    if vswitch.busy:
        return Change(Action.WAIT)
    removing = sorted(
        n
        for n in (leave | join)
        if (entry := vswitch.member(n)) is not None
        and (n in leave or entry.status is VSwitchServerStatus.FAILED)
        and not vswitch.cancelled
    )
    if removing:
        return Change(Action.REMOVE, tuple(removing))
    adding: list[int] = []
    room = SERVERS_PER_VSWITCH - len(vswitch.server)
    for number in sorted(n for n in join if vswitch.member(n) is None):
        why = check_join(vswitch, [number], counts)
        if why is None and len(adding) >= room:
            why = check_join(vswitch, [*adding, number], counts)
        if why is not None:
            refused[number] = why
        else:
            adding.append(number)
    if adding:
        return Change(Action.ADD, tuple(adding), refused)
    return Change(Action.NONE, (), refused)
