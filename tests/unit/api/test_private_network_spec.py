"""spec.privateNetwork on a HetznerGPUCluster: a vSwitch by id or created by us with a VLAN (4000-4091) and
a name, an IPv4 private subnet, a host range inside it that spares the network, gateway (.1) and broadcast
addresses (the whole subnet but those when unset), MTU at most 1400 (the default), routes outside the
subnet and inside RFC 1918 (never a default route or a public network); each refusal names the field and
the fix; a cluster without it is unchanged."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from pydantic import ValidationError

from capi_gpu.api.cluster import HetznerGPUClusterSpec
from capi_gpu.api.network import PrivateNetworkSpec

BASE: dict[str, Any] = {"vswitch": {"vlan": 4000, "name": "gpu-net"}, "subnet": "10.0.1.0/24"}


def spec(**changes: Any) -> PrivateNetworkSpec:
    return PrivateNetworkSpec.model_validate({**BASE, **changes})


def refusal(**changes: Any) -> str:
    with pytest.raises(ValidationError) as err:
        spec(**changes)
    return "; ".join(e["msg"] for e in err.value.errors(include_url=False))


def test_defaults_spare_network_gateway_and_broadcast() -> None:
    got = spec()
    assert got.mtu == 1400
    assert got.host_range() == (ipaddress.IPv4Address("10.0.1.2"), ipaddress.IPv4Address("10.0.1.254"))
    assert str(got.gateway()) == "10.0.1.1"
    assert got.wire() == {
        "vswitch": {"vlan": 4000, "name": "gpu-net"},
        "subnet": "10.0.1.0/24",
        "mtu": 1400,
        "routes": [],
    }


@pytest.mark.parametrize(
    "vswitch",
    [{"id": 12345}, {"vlan": 4000}, {"vlan": 4091, "name": "x"}],
)
def test_a_vswitch_by_id_or_by_vlan(vswitch: dict[str, Any]) -> None:
    assert spec(vswitch=vswitch).vswitch.model_dump(exclude_none=True) == vswitch


@pytest.mark.parametrize(
    ("vswitch", "expected"),
    [
        ({}, "exactly one"),
        ({"id": 1, "vlan": 4000}, "exactly one"),
        ({"id": 1, "name": "x"}, "name is for a vSwitch we create"),
        ({"vlan": 3999}, "greater than or equal to 4000"),
        ({"vlan": 4092}, "less than or equal to 4091"),
        ({"id": 0}, "greater than or equal to 1"),
    ],
)
def test_vswitch_refusals(vswitch: dict[str, Any], expected: str) -> None:
    assert expected in refusal(vswitch=vswitch)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"subnet": "10.0.1.5/24"}, "subnet 10.0.1.5/24 has host bits set: write it as 10.0.1.0/24"),
        ({"subnet": "8.8.8.0/24"}, "not a private range"),
        ({"subnet": "10.0.1.0/30"}, "too small"),
        ({"subnet": "10.0.1.0"}, "String should match pattern"),
        ({"addresses": {"start": "10.0.1.1", "end": "10.0.1.9"}}, "addresses.start 10.0.1.1 is the subnet's gateway"),
        ({"addresses": {"start": "10.0.1.0", "end": "10.0.1.9"}}, "network or broadcast address"),
        (
            {"addresses": {"start": "10.0.1.2", "end": "10.0.1.255"}},
            "addresses.end 10.0.1.255 is the subnet's network or",
        ),
        ({"addresses": {"start": "10.0.2.2", "end": "10.0.1.9"}}, "addresses.start 10.0.2.2 is outside subnet"),
        ({"addresses": {"start": "10.0.1.9", "end": "10.0.1.2"}}, "addresses.start 10.0.1.9 is after addresses.end"),
        ({"addresses": {"start": "10.0.1.300", "end": "10.0.1.9"}}, "String should match pattern"),
        ({"mtu": 1500}, "less than or equal to 1400"),
        ({"routes": ["10.0.1.0/25"]}, "lies inside the subnet"),
        ({"routes": ["10.0.0.1/16"]}, "routes: 10.0.0.1/16 has host bits set"),
        # Through the vSwitch gateway, a default route or a public network would cut the host off its main NIC.
        ({"routes": ["0.0.0.0/0"]}, "routes: 0.0.0.0/0 is a default route"),
        ({"routes": ["10.0.0.0/16", "0.0.0.0/0"]}, "routes: 0.0.0.0/0 is a default route"),
        ({"routes": ["8.8.8.0/24"]}, "routes: 8.8.8.0/24 is not a private range"),
        ({"routes": ["0.0.0.0/1"]}, "routes: 0.0.0.0/1 is not a private range"),
        ({"routes": ["0.0.0.0/8"]}, "routes: 0.0.0.0/8 is not a private range"),  # is_private, not RFC 1918
        ({"routes": ["127.0.0.0/8"]}, "routes: 127.0.0.0/8 is not a private range"),
        ({"routes": ["100.64.0.0/10"]}, "routes: 100.64.0.0/10 is not a private range"),
        ({"routes": ["10.0.0.0/7"]}, "routes: 10.0.0.0/7 is not a private range"),  # holds 10/8, and 11/8
        ({"routes": ["172.32.0.0/16"]}, "routes: 172.32.0.0/16 is not a private range"),
    ],
)
def test_address_refusals_name_the_field_and_the_fix(changes: dict[str, Any], expected: str) -> None:
    assert expected in refusal(**changes)


def test_a_range_and_routes_that_fit() -> None:
    routes = ["10.0.0.0/16", "10.0.2.7/32", "172.16.0.0/12", "192.168.5.0/24", "10.0.0.0/8"]
    got = spec(addresses={"start": "10.0.1.10", "end": "10.0.1.20"}, mtu=1350, routes=routes)
    assert got.host_range() == (ipaddress.IPv4Address("10.0.1.10"), ipaddress.IPv4Address("10.0.1.20"))
    assert got.routes == routes  # the coupled hcloud Network contains the vSwitch subnet: fine


def test_a_cluster_without_it_is_unchanged() -> None:
    cluster = {"robotCredentials": {"name": "robot"}, "sshKeys": {"rescue": {"name": "ssh"}}}
    parsed = HetznerGPUClusterSpec.model_validate(cluster)
    assert parsed.private_network is None
    assert "privateNetwork" not in parsed.wire()
