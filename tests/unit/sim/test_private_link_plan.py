"""The simulated private link's decisions: which ports should exist (ready members of the fleet with a VLAN
interface of that vSwitch's VLAN; not a processing, failed or leaving server, not a machine outside the fleet,
not an interface of another VLAN), the plan from what exists to that (a changed MAC is a new port, a bridge
lives while it has ports), the VLAN interfaces read from ``ip -j link``, and the names the registry sweeps."""

from __future__ import annotations

import json

import pytest

from capi_gpu_sim import private_link
from capi_gpu_sim.hosts import names
from capi_gpu_sim.private_link import Port

MAC_A, MAC_B, MAC_C = "02:00:00:00:00:0a", "02:00:00:00:00:0b", "02:00:00:00:00:0c"
HOSTS = {101: 0, 102: 1, 103: 2}


@pytest.mark.parametrize(
    ("links", "interfaces", "ports"),
    [
        # two ready members with the VLAN's interface: a port each; the third has an interface, no membership
        (
            {1: (4000, {101, 102})},
            {101: {4000: MAC_A}, 102: {4000: MAC_B}, 103: {4000: MAC_C}},
            {Port(4000, 0, MAC_A), Port(4000, 1, MAC_B)},
        ),
        # a member whose playbook has not run yet (no interface) has no port yet
        ({1: (4000, {101, 102})}, {101: {4000: MAC_A}}, {Port(4000, 0, MAC_A)}),
        # an interface of another VLAN does not carry this vSwitch's frames
        ({1: (4000, {101, 102})}, {101: {4000: MAC_A}, 102: {4001: MAC_B}}, {Port(4000, 0, MAC_A)}),
        # a member Robot knows but the fleet has no machine for
        ({1: (4000, {101, 999})}, {101: {4000: MAC_A}, 999: {4000: MAC_B}}, {Port(4000, 0, MAC_A)}),
        # no ready member (processing, failed and leaving servers are not in ready_members)
        ({1: (4000, set())}, {101: {4000: MAC_A}}, set()),
        # one host on two vSwitches: a port on each link
        (
            {1: (4000, {101}), 2: (4001, {101})},
            {101: {4000: MAC_A, 4001: MAC_B}},
            {Port(4000, 0, MAC_A), Port(4001, 0, MAC_B)},
        ),
    ],
)
def test_ports_exist_for_ready_fleet_members_with_an_interface_of_the_vlan(
    links: dict[int, tuple[int, set[int]]], interfaces: dict[int, dict[int, str]], ports: set[Port]
) -> None:
    assert private_link.desired(links, HOSTS, interfaces) == ports


def test_the_plan_adds_removes_and_keeps_a_bridge_only_while_it_has_ports() -> None:
    a, b = Port(4000, 0, MAC_A), Port(4000, 1, MAC_B)
    first = private_link.plan((), {a, b}, ())
    assert (first.add, first.remove, first.bridges_up, first.bridges_down) == ((a, b), (), (4000,), ())
    assert private_link.plan({a, b}, {a, b}, {4000}).empty, "nothing to do twice"
    leave = private_link.plan({a, b}, {a}, {4000})
    assert (leave.remove, leave.add, leave.bridges_down) == ((b,), (), ())
    last = private_link.plan({a}, (), {4000})
    assert (last.remove, last.bridges_down) == ((a,), (4000,))


def test_a_recreated_interface_is_a_new_port() -> None:
    old, new = Port(4000, 0, MAC_A), Port(4000, 0, MAC_C)
    change = private_link.plan({old}, {new}, {4000})
    assert (change.remove, change.add, change.bridges_up, change.bridges_down) == ((old,), (new,), (), ())


def test_vlan_interfaces_are_the_netplan_stand_ins_up_links() -> None:
    links = [
        {"ifname": "lo", "flags": ["LOOPBACK", "UP"], "address": "00:00:00:00:00:00"},
        {"ifname": "eth0", "flags": ["UP"], "address": "02:11:11:11:11:11"},
        {"ifname": "eth0.4000", "flags": ["UP"], "address": MAC_A, "ifalias": "sim-vlan 4000"},
        {"ifname": "vlan4001", "flags": ["UP"], "address": MAC_B, "ifalias": "sim-vlan 4001"},
        {"ifname": "eth0.4002", "flags": [], "address": MAC_C, "ifalias": "sim-vlan 4002"},  # down
        {"ifname": "x", "flags": ["UP"], "address": MAC_C, "ifalias": "sim-vlan four"},
    ]
    assert private_link.vlan_interfaces(json.dumps(links)) == {4000: MAC_A, 4001: MAC_B}
    assert private_link.vlan_interfaces("") == {}


def test_every_private_link_name_fits_a_link_name_and_carries_its_slot() -> None:
    host = names.HostNames(names.MAX_SLOT, names.MAX_HOSTS - 1)
    for vlan in (4000, 4091):
        every = [names.private_bridge(names.MAX_SLOT, vlan), *host.private_port(vlan), host.veth_host]
        assert all(len(name) <= 15 for name in every), every  # IFNAMSIZ is 16 with the NUL
        assert {names.slot_of_link(name) for name in every} == {names.MAX_SLOT}
    assert names.slot_of_link("cgpu") is None and names.slot_of_link("eth0") is None
    assert names.slot_of_link("cgpu12h3") == 12
