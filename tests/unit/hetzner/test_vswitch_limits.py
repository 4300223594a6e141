"""vSwitch limits before anything is sent: the VLAN range 4000-4091 and its uniqueness, 100 servers per
vSwitch, 5 vSwitches per server, cancelled vSwitches; a host's membership from Robot's status; and the
one change per vSwitch (removals first, failed members re-added, busy means wait, partial refusals)."""

from __future__ import annotations

from typing import Any

import pytest

from capi_gpu.hetzner import vswitch_plan as plan
from capi_gpu.hetzner.models import VSwitch

Action, Refusal, Membership = plan.Action, plan.Refusal, plan.Membership


def vswitch(
    members: dict[int, str] | None = None, *, vid: int = 7, vlan: int = 4000, cancelled: bool = False
) -> VSwitch:
    servers: list[dict[str, Any]] = [{"server_number": n, "status": s} for n, s in (members or {}).items()]
    return VSwitch.model_validate({"id": vid, "name": "gpu", "vlan": vlan, "cancelled": cancelled, "server": servers})


def full(count: int = 100) -> dict[int, str]:
    return {1000 + i: "ready" for i in range(count)}


@pytest.mark.parametrize(
    ("vlan", "reason"),
    [
        (3999, Refusal.VLAN_OUT_OF_RANGE),
        (4000, None),
        (4091, None),
        (4092, Refusal.VLAN_OUT_OF_RANGE),
        (1, Refusal.VLAN_OUT_OF_RANGE),
    ],
)
def test_vlan_range(vlan: int, reason: Refusal | None) -> None:
    verdict = plan.check_vlan(vlan)
    assert (verdict.reason if verdict else None) == reason
    if verdict:
        assert "4000-4091" in verdict.message


@pytest.mark.parametrize(
    ("vlan", "existing", "reason"),
    [
        (4000, [], None),
        (4000, [vswitch(vlan=4001)], None),
        (4000, [vswitch(vlan=4000, vid=9)], Refusal.VLAN_IN_USE),
        (4000, [vswitch(vlan=4000, vid=9, cancelled=True)], Refusal.VLAN_IN_USE),
        (5000, [], Refusal.VLAN_OUT_OF_RANGE),
    ],
)
def test_a_new_vswitch_needs_a_free_vlan(vlan: int, existing: list[VSwitch], reason: Refusal | None) -> None:
    verdict = plan.check_create(vlan, existing)
    assert (verdict.reason if verdict else None) == reason
    if reason is Refusal.VLAN_IN_USE:
        assert verdict is not None
        assert "vSwitch 9" in verdict.message


@pytest.mark.parametrize(
    ("members", "joining", "counts", "cancelled", "reason"),
    [
        ({}, [1], {}, False, None),
        (full(99), [1], {}, False, None),
        (full(100), [1], {}, False, Refusal.VSWITCH_FULL),
        (full(99), [1, 2], {}, False, Refusal.VSWITCH_FULL),
        (full(100), [1000], {}, False, None),  # already a member: nothing added
        ({}, [1], {1: 4}, False, None),
        ({}, [1], {1: 5}, False, Refusal.SERVER_VSWITCH_LIMIT),
        ({}, [1], {}, True, Refusal.VSWITCH_CANCELLED),
    ],
)
def test_join_limits(
    members: dict[int, str], joining: list[int], counts: dict[int, int], cancelled: bool, reason: Refusal | None
) -> None:
    verdict = plan.check_join(vswitch(members, cancelled=cancelled), joining, counts)
    assert (verdict.reason if verdict else None) == reason


def test_limit_messages_name_the_limit_and_the_fix() -> None:
    full_one = plan.check_join(vswitch(full(100)), [1], {})
    per_server = plan.check_join(vswitch(), [1], {1: 5})
    assert full_one is not None
    assert "Robot allows 100 per vSwitch" in full_one.message
    assert per_server is not None
    assert "5 per server" in per_server.message
    assert str(per_server).startswith("ServerVSwitchLimit: ")


def test_memberships_count_every_status() -> None:
    switches = [vswitch({1: "ready"}), vswitch({1: "processing", 2: "ready"}), vswitch({2: "failed"})]
    assert [plan.memberships(switches, n) for n in (1, 2, 3)] == [2, 2, 0]


@pytest.mark.parametrize(
    ("status", "leaving", "expected"),
    [
        (None, False, Membership.ABSENT),
        ("processing", False, Membership.JOINING),
        ("in process", False, Membership.JOINING),
        ("processing", True, Membership.LEAVING),
        ("ready", False, Membership.READY),
        ("ready", True, Membership.READY),
        ("failed", False, Membership.FAILED),
        ("something new", False, Membership.JOINING),
    ],
)
def test_membership_of_a_host(status: str | None, leaving: bool, expected: Membership) -> None:
    members = {321: status} if status is not None else {}
    assert plan.membership(vswitch(members), 321, leaving=leaving) is expected


@pytest.mark.parametrize(
    ("members", "join", "leave", "counts", "action", "servers", "refused"),
    [
        ({}, set(), set(), {}, Action.NONE, (), {}),
        ({}, {3, 1, 2}, set(), {}, Action.ADD, (1, 2, 3), {}),
        ({1: "ready"}, {1, 2}, set(), {}, Action.ADD, (2,), {}),
        ({1: "ready"}, {1}, set(), {}, Action.NONE, (), {}),
        ({1: "processing"}, {2}, set(), {}, Action.WAIT, (), {}),
        ({1: "processing"}, set(), {1}, {}, Action.WAIT, (), {}),
        ({1: "ready", 2: "ready"}, {3}, {2, 1}, {}, Action.REMOVE, (1, 2), {}),
        ({1: "failed"}, {1}, set(), {}, Action.REMOVE, (1,), {}),
        ({1: "ready"}, {1}, {1}, {}, Action.REMOVE, (1,), {}),  # leaving wins
        ({}, set(), {1}, {}, Action.NONE, (), {}),
        ({}, {1, 2}, set(), {1: 5}, Action.ADD, (2,), {1: Refusal.SERVER_VSWITCH_LIMIT}),
        ({}, {1}, set(), {1: 5}, Action.NONE, (), {1: Refusal.SERVER_VSWITCH_LIMIT}),
        (full(98), {3, 1, 2}, set(), {}, Action.ADD, (1, 2), {3: Refusal.VSWITCH_FULL}),
    ],
)
def test_next_change(
    members: dict[int, str],
    join: set[int],
    leave: set[int],
    counts: dict[int, int],
    action: Action,
    servers: tuple[int, ...],
    refused: dict[int, Refusal],
) -> None:
    change = plan.next_change(vswitch(members), join, leave, counts)
    assert (change.action, change.servers) == (action, servers)
    assert {n: v.reason for n, v in change.refused.items()} == refused


def test_a_cancelled_vswitch_takes_no_one_and_loses_no_one() -> None:
    change = plan.next_change(vswitch({1: "ready"}, cancelled=True), {2}, {1})
    assert change.action is Action.NONE
    assert change.refused[2].reason is Refusal.VSWITCH_CANCELLED
