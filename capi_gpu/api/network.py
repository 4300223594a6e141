"""A cluster's private network over a Robot vSwitch: the spec a user writes and the status we keep.

Bare-metal workers otherwise talk to the control plane over the public internet. A vSwitch is a layer-2
VLAN between an account's dedicated servers (optionally coupled to an hcloud Network); each host joins it
before it joins the cluster and gets a VLAN interface (MTU 1400, as Hetzner requires) with an address from
``addresses``, which the kubelet uses as its node IP. docs/private-network.md has the whole design.

The rules live on the models, so the webhook, the controllers and ``capi-gpu crds`` agree: the schema
refuses what a pattern or CEL can say (IPv4 syntax, id or vlan, VLAN 4000-4091), and the model validator
what needs arithmetic on addresses (a range inside the subnet that spares its network, gateway and
broadcast addresses), with messages that name the field and the fix.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from capi_gpu.api.base import KubeModel, cel, validations

VLAN_MIN, VLAN_MAX = 4000, 4091  # Robot's vSwitch VLAN range (also hetzner.vswitch_plan's)
MAX_MTU = 1400  # Hetzner requires 1400 on a vSwitch VLAN interface; lower is allowed (tunnels inside)
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4_PATTERN = rf"^({_OCTET}\.){{3}}{_OCTET}$"
CIDR_PATTERN = rf"^({_OCTET}\.){{3}}{_OCTET}/(3[0-2]|[12]?[0-9])$"

# The only ranges a route through the vSwitch gateway may reach: every other destination (the internet, or a
# default route) would leave the main NIC for the vSwitch and can cut the host off its only public link.
RFC1918 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))

IPv4 = Annotated[str, Field(max_length=15, pattern=IPV4_PATTERN)]
CIDR = Annotated[str, Field(max_length=18, pattern=CIDR_PATTERN)]


class VSwitchRef(KubeModel):
    """Which vSwitch: an existing one by id, or one we create with a VLAN (and a name)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.id) != has(self.vlan)",
                "give id (an existing vSwitch) or vlan (one we create), exactly one of them",
            ),
            cel(
                "!has(self.name) || has(self.vlan)",
                "name is for a vSwitch we create (with vlan); one named by id keeps its Robot name",
                field=".name",
                reason="FieldValueForbidden",
            ),
        )
    )

    id: Annotated[int | None, Field(ge=1)] = None
    """Robot id of an existing vSwitch (Robot: Servers, vSwitches). We never cancel one named by id."""
    vlan: Annotated[int | None, Field(ge=VLAN_MIN, le=VLAN_MAX)] = None
    """VLAN id (4000-4091, unique in the Robot account) of a vSwitch we create, and cancel with the cluster."""
    name: Annotated[str | None, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")] = None
    """Name of the vSwitch we create; the cluster's name when unset."""

    @model_validator(mode="after")
    def _one_way(self) -> VSwitchRef:
        if (self.id is None) == (self.vlan is None):
            raise PydanticCustomError("vswitch", "give id (an existing vSwitch) or vlan (one we create), exactly one")
        if self.name is not None and self.vlan is None:
            raise PydanticCustomError("vswitch", "name is for a vSwitch we create (with vlan), not one named by id")
        return self


class AddressRange(KubeModel):
    """First and last host address handed out, inclusive."""

    start: IPv4
    """First address, e.g. 10.0.1.10."""
    end: IPv4
    """Last address, e.g. 10.0.1.200."""


class PrivateNetworkSpec(KubeModel):
    """A private network over a Robot vSwitch for this cluster's hosts."""

    vswitch: VSwitchRef
    """The vSwitch, by id or created by us."""
    subnet: CIDR
    """The vSwitch's IPv4 subnet, a private range such as 10.0.1.0/24. Its first address (10.0.1.1) is the
    gateway by Hetzner's convention (an hcloud Network coupled to the vSwitch takes it), never a host's."""
    addresses: AddressRange | None = None
    """Host addresses to hand out; every address of the subnet but its network, gateway and broadcast
    addresses when unset. A host keeps its address until it is released."""
    mtu: Annotated[int, Field(ge=1280, le=MAX_MTU)] = MAX_MTU
    """MTU of the VLAN interface: at most 1400, as Hetzner requires on a vSwitch."""
    routes: Annotated[list[CIDR], Field(max_length=8)] = []
    """Networks reached through the subnet's gateway, e.g. the range of an hcloud Network coupled to the
    vSwitch (10.0.0.0/16), so an hcloud control plane is reached privately (docs/private-network.md). Each
    lies inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16 and outside the subnet: never a default route or
    a public network, which would leave the main NIC for the vSwitch."""

    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    def gateway(self) -> ipaddress.IPv4Address:
        return self.network().network_address + 1

    def host_range(self) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
        """First and last address a host may get (inclusive)."""
        net = self.network()
        if self.addresses is None:
            return net.network_address + 2, net.broadcast_address - 1
        return ipaddress.IPv4Address(self.addresses.start), ipaddress.IPv4Address(self.addresses.end)

    @model_validator(mode="after")
    def _addresses_fit(self) -> PrivateNetworkSpec:
        found = problems(self)
        if found:
            raise PydanticCustomError("private_network", "; ".join(found))
        return self


def _subnet_problems(subnet: str) -> tuple[ipaddress.IPv4Network | None, list[str]]:
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError:
        loose = ipaddress.IPv4Network(subnet, strict=False)
        return None, [f"subnet {subnet} has host bits set: write it as {loose}"]
    if not net.is_private:
        return None, [f"subnet {subnet} is not a private range: use one such as 10.0.1.0/24"]
    if net.prefixlen > 29:
        return None, [f"subnet {subnet} is too small: a /29 or larger leaves room beside the gateway"]
    return net, []


def problems(spec: PrivateNetworkSpec) -> list[str]:
    """Everything wrong with the addresses of ``spec``, each naming its field and the fix."""
    net, found = _subnet_problems(spec.subnet)
    if net is None:
        return found
    lowest, highest = net.network_address + 2, net.broadcast_address - 1
    first, last = spec.host_range()
    for field, address in (("addresses.start", first), ("addresses.end", last)):
        if address not in net:
            found.append(f"{field} {address} is outside subnet {net}")
        elif address == net.network_address + 1:
            found.append(f"{field} {address} is the subnet's gateway (Hetzner's convention): start at {lowest}")
        elif address in (net.network_address, net.broadcast_address):
            found.append(f"{field} {address} is the subnet's network or broadcast address: use {lowest}-{highest}")
    if not found and first > last:
        found.append(f"addresses.start {first} is after addresses.end {last}")
    for route in spec.routes:
        try:
            target = ipaddress.IPv4Network(route, strict=True)
        except ValueError:
            found.append(f"routes: {route} has host bits set: write it as {ipaddress.IPv4Network(route, strict=False)}")
            continue
        if target.prefixlen == 0:
            found.append(
                f"routes: {route} is a default route, which would take the host off its main NIC: "
                "give the private networks to reach, such as 10.0.0.0/16"
            )
        elif not any(target.subnet_of(private) for private in RFC1918):
            found.append(
                f"routes: {route} is not a private range: give a network inside 10.0.0.0/8, 172.16.0.0/12 "
                "or 192.168.0.0/16 (a public one would leave the main NIC for the vSwitch)"
            )
        elif target.subnet_of(net):
            found.append(f"routes: {route} lies inside the subnet {net}, which is on-link already")
    return found


class VSwitchMembership(StrEnum):
    """A host's place on its cluster's vSwitch, from Robot's member status."""

    ABSENT = "Absent"
    JOINING = "Joining"  # Robot says processing after an add (or a status it didn't name)
    READY = "Ready"
    FAILED = "Failed"  # Robot could not configure the port: it is removed and added again
    LEAVING = "Leaving"  # processing after a remove


class PrivateNetworkStatus(KubeModel):
    """The cluster's vSwitch as last seen."""

    vswitch_id: int | None = None
    """The vSwitch in use. Recorded as soon as Robot answers a create, so a restart never creates a second
    (its VLAN, unique in the account, finds it again if the record is lost)."""
    vlan: int | None = None
    """Its VLAN id."""
    created: bool = False
    """We created it, so deleting the cluster cancels it; false for one named by id."""
    servers: Annotated[int | None, Field(ge=0)] = None
    """Servers on it at the last read, whoever put them there (Robot allows 100)."""


class HostPrivateNetwork(KubeModel):
    """A host's place on its cluster's private network: the address it holds and its vSwitch membership."""

    vswitch_id: Annotated[int, Field(ge=1)]
    """The vSwitch the host is on or joining."""
    address: IPv4
    """Its address on the subnet, held until the host is released (the allocator never hands it out twice)."""
    membership: VSwitchMembership = VSwitchMembership.ABSENT
    """Robot's view of the host's port, at the last read."""
