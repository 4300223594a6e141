"""Private-network addresses: the lowest free address of the range, deterministic, a host's own record
given back (even outside a narrowed range), garbage records ignored, exhaustion with a clear reason;
records read from hosts per vSwitch; the VLAN interface and node IP handed to the playbook; and clusters
that would create the same VLAN or overlap addresses on one vSwitch."""

from __future__ import annotations

from typing import Any

import pytest

from capi_gpu.api.network import PrivateNetworkSpec
from capi_gpu.provisioning import private_network as pn

SMALL = PrivateNetworkSpec.model_validate(
    {"vswitch": {"id": 7}, "subnet": "10.0.1.0/24", "addresses": {"start": "10.0.1.10", "end": "10.0.1.12"}}
)


@pytest.mark.parametrize(
    ("held", "owner", "expected"),
    [
        ({}, "ns/a", "10.0.1.10"),
        ({"ns/b": "10.0.1.10"}, "ns/a", "10.0.1.11"),
        ({"ns/b": "10.0.1.11"}, "ns/a", "10.0.1.10"),  # a released address is reused, lowest first
        ({"ns/b": "10.0.1.10", "ns/c": "10.0.1.12"}, "ns/a", "10.0.1.11"),
        ({"ns/a": "10.0.1.12", "ns/b": "10.0.1.10"}, "ns/a", "10.0.1.12"),  # its own record comes back
        ({"ns/a": "10.0.1.200"}, "ns/a", "10.0.1.200"),  # in the subnet, outside a range narrowed since
        ({"ns/a": "10.9.9.9"}, "ns/a", "10.0.1.10"),  # outside the subnet: a fresh one
        ({"ns/b": "not-an-ip", "ns/c": "10.0.1.10"}, "ns/a", "10.0.1.11"),
        ({"ns/b": "10.0.1.99"}, "ns/a", "10.0.1.10"),  # a record outside the range takes nothing from it
    ],
)
def test_allocation_table(held: dict[str, str], owner: str, expected: str) -> None:
    got = pn.allocate(SMALL, held, owner)
    assert isinstance(got, pn.Allocated)
    assert str(got.address) == expected
    assert got.interface == f"{expected}/24"


def test_allocation_is_deterministic_whatever_the_order_of_records() -> None:
    forward = {"ns/b": "10.0.1.10", "ns/c": "10.0.1.11"}
    backward = dict(reversed(list(forward.items())))
    assert pn.allocate(SMALL, forward, "ns/a") == pn.allocate(SMALL, backward, "ns/a")


def test_exhaustion_says_which_range_and_what_to_do() -> None:
    held = {"ns/b": "10.0.1.10", "ns/c": "10.0.1.11", "ns/d": "10.0.1.12"}
    got = pn.allocate(SMALL, held, "ns/a")
    assert isinstance(got, pn.Exhausted)
    assert got.reason is pn.AddressReason.EXHAUSTED
    assert "all 3 addresses of 10.0.1.10-10.0.1.12 on 10.0.1.0/24 are held" in got.message
    assert "widen spec.privateNetwork.addresses or release a host" in got.message


def test_the_default_range_spares_the_gateway() -> None:
    whole = PrivateNetworkSpec.model_validate({"vswitch": {"id": 7}, "subnet": "10.0.1.0/29"})
    picked = []
    held: dict[str, str] = {}
    for n in range(6):
        got = pn.allocate(whole, held, f"ns/h{n}")
        if isinstance(got, pn.Exhausted):
            break
        held[f"ns/h{n}"] = str(got.address)
        picked.append(str(got.address))
    assert picked == ["10.0.1.2", "10.0.1.3", "10.0.1.4", "10.0.1.5", "10.0.1.6"]


def host(name: str, namespace: str, record: dict[str, Any] | None) -> dict[str, Any]:
    status = {"privateNetwork": record} if record is not None else {}
    return {"metadata": {"name": name, "namespace": namespace}, "status": status}


def test_records_are_read_from_hosts_on_the_same_vswitch_across_namespaces() -> None:
    hosts = [
        host("a", "one", {"vswitchID": 7, "address": "10.0.1.10", "membership": "Ready"}),
        host("b", "two", {"vswitchID": 7, "address": "10.0.1.11"}),
        host("c", "one", {"vswitchID": 8, "address": "10.0.1.12"}),
        host("d", "one", None),
        {"metadata": {"name": "e", "namespace": "one"}},
    ]
    assert pn.held_by_hosts(hosts, 7) == {"one/a": "10.0.1.10", "two/b": "10.0.1.11"}


def test_the_vlan_interface_carries_mtu_gateway_routes_and_the_node_ip() -> None:
    routed = PrivateNetworkSpec.model_validate(
        {"vswitch": {"vlan": 4000}, "subnet": "10.0.1.0/24", "mtu": 1400, "routes": ["10.0.0.0/16"]}
    )
    allocated = pn.allocate(routed, {}, "ns/a")
    assert isinstance(allocated, pn.Allocated)
    interface = pn.vlan_interface(routed, 4000, allocated)
    assert interface.playbook_vars() == {
        "private_network": {
            "vlan": 4000,
            "mtu": 1400,
            "address": "10.0.1.2/24",
            "gateway": "10.0.1.1",
            "routes": ["10.0.0.0/16"],
        },
        "kubelet_extra_args": ["--node-ip=10.0.1.2"],
    }


def cluster(name: str, network: dict[str, Any], status_id: int | None = None) -> dict[str, Any]:
    status = {"privateNetwork": {"vswitchID": status_id}} if status_id else {}
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"privateNetwork": network}, "status": status}


ONE = {"vswitch": {"vlan": 4000}, "subnet": "10.0.1.0/24", "addresses": {"start": "10.0.1.10", "end": "10.0.1.99"}}


@pytest.mark.parametrize(
    ("mine", "theirs", "expected"),
    [
        (ONE, cluster("b", ONE), "vswitch.vlan 4000 is already requested by HetznerGPUCluster ns/b"),
        (ONE, cluster("b", {**ONE, "vswitch": {"vlan": 4001}}), None),
        (
            {**ONE, "vswitch": {"id": 40000}},
            cluster("b", ONE, status_id=40000),
            "addresses 10.0.1.10-10.0.1.99 overlap 10.0.1.10-10.0.1.99 of HetznerGPUCluster ns/b on vSwitch 40000",
        ),
        (
            {**ONE, "vswitch": {"id": 40000}, "addresses": {"start": "10.0.1.100", "end": "10.0.1.200"}},
            cluster("b", ONE, status_id=40000),
            None,
        ),
        ({**ONE, "vswitch": {"id": 40000}}, cluster("b", {**ONE, "vswitch": {"id": 40001}}), None),
        (ONE, cluster("a", ONE), None),  # itself, on update
        (ONE, cluster("b", {"vswitch": {}, "subnet": "garbage"}), None),
    ],
)
def test_clusters_that_clash(mine: dict[str, Any], theirs: dict[str, Any], expected: str | None) -> None:
    me = cluster("a", mine)
    found = pn.cluster_conflicts(PrivateNetworkSpec.model_validate(mine), me, [theirs])
    assert len(found) == (0 if expected is None else 1)
    if expected is not None:
        assert expected in found[0]
