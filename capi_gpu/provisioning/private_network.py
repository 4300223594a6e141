"""Addresses on a cluster's private network: who gets which, and what a host's VLAN interface carries.

A host holds its address in its own status (``status.privateNetwork.address``), so the record lives and
dies with the claim: release drops it, and the address is free again. No allocation table to keep in step,
nothing to leak when a host is deleted, and a ``clusterctl move`` carries the records with the hosts.
Allocation is a pure function of the spec's range and the addresses hosts already hold: the lowest free
address, so two passes over the same objects pick the same one, and a host that already holds an address
gets it back (a restarted controller rediscovers rather than re-allocates).

CAPI's IPAM contract (IPAddressClaim) would need an IPAM provider in every management cluster for one
range per cluster; a range in the spec is enough here, and the records keep the door open (a claim's
address could be recorded the same way).

Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from capi_gpu.api.network import HostPrivateNetwork, PrivateNetworkSpec, PrivateNetworkStatus, VSwitchMembership


class AddressReason(StrEnum):
    EXHAUSTED = "AddressesExhausted"


@dataclass(frozen=True)
class Allocated:
    address: ipaddress.IPv4Address
    network: ipaddress.IPv4Network

    @property
    def interface(self) -> str:
        """Address with prefix, as ip-address and netplan write it: 10.0.1.10/24."""
        return f"{self.address}/{self.network.prefixlen}"


@dataclass(frozen=True)
class Exhausted:
    message: str
    reason: AddressReason = AddressReason.EXHAUSTED


def allocate(spec: PrivateNetworkSpec, held: Mapping[str, str], owner: str) -> Allocated | Exhausted:
    """The address for ``owner`` (a host, ``namespace/name``), given what every host holds on this vSwitch.

    The owner's own record wins if it lies in the subnet, even outside a range narrowed since: moving a
    running node to another IP is worse than an address outside the current range. Records that don't
    parse are ignored; they can't be on the link.
    """
    network = spec.network()
    mine = _parse(held.get(owner))
    if mine is not None and mine in network:
        return Allocated(mine, network)
    taken = {address for who, raw in held.items() if who != owner and (address := _parse(raw)) is not None}
    first, last = spec.host_range()
    candidate = first
    while candidate <= last:  # at most len(taken) + 1 steps: each step skips one taken address
        if candidate not in taken:
            return Allocated(candidate, network)
        candidate += 1
    size = int(last) - int(first) + 1
    return Exhausted(
        f"all {size} addresses of {first}-{last} on {network} are held by hosts: widen spec.privateNetwork.addresses "
        "or release a host"
    )


def _parse(raw: str | None) -> ipaddress.IPv4Address | None:
    if raw is None:
        return None
    try:
        return ipaddress.IPv4Address(raw)
    except ValueError:
        return None


def held_by_hosts(hosts: Iterable[Mapping[str, Any]], vswitch_id: int) -> dict[str, str]:
    """``namespace/name`` -> address, for every host (as the API returns it) holding one on this vSwitch.

    Across namespaces: clusters may share a vSwitch (with disjoint ranges), and its link is one L2 domain.
    """
    out: dict[str, str] = {}
    for host in hosts:
        meta = host.get("metadata") or {}
        record = (host.get("status") or {}).get("privateNetwork") or {}
        if record.get("vswitchID") == vswitch_id and isinstance(record.get("address"), str):
            out[f"{meta.get('namespace')}/{meta.get('name')}"] = record["address"]
    return out


@dataclass(frozen=True)
class VLANInterface:
    """What the node install writes (a VLAN on the NIC carrying the main IP), and the kubelet's node IP."""

    vlan: int
    mtu: int
    address: str  # with prefix, 10.0.1.10/24
    gateway: str
    routes: tuple[str, ...]  # through the gateway, e.g. a coupled hcloud Network's range

    @property
    def node_ip(self) -> str:
        return self.address.split("/", 1)[0]

    def playbook_vars(self) -> dict[str, Any]:
        """Plain data for the node-install playbook (written as JSON data by ``ansible_data``, never code): the
        interface for a network role, and the node IP as the kubelet role's existing ``kubelet_extra_args``
        (``/etc/default/kubelet``, read after kubeadm's flags, so a user's bootstrap config can't drop it)."""
        return {
            "private_network": {
                "vlan": self.vlan,
                "mtu": self.mtu,
                "address": self.address,
                "gateway": self.gateway,
                "routes": list(self.routes),
            },
            "kubelet_extra_args": [f"--node-ip={self.node_ip}"],
        }


def vlan_interface(spec: PrivateNetworkSpec, vlan: int, allocated: Allocated) -> VLANInterface:
    """``vlan`` is the vSwitch's, as Robot reports it (a vSwitch named by id has no VLAN in the spec)."""
    return VLANInterface(
        vlan=vlan,
        mtu=spec.mtu,
        address=allocated.interface,
        gateway=str(spec.gateway()),
        routes=tuple(spec.routes),
    )


def recorded_interface(
    spec: PrivateNetworkSpec, cluster: PrivateNetworkStatus | None, record: HostPrivateNetwork | None, host: str
) -> VLANInterface | str:
    """The VLAN interface a provisioned host already has, rebuilt from its record and its cluster (for a run of
    the node playbook outside Configure, such as ``nodes relayout``), or why it can't be: without it the run
    would rewrite /etc/default/kubelet without ``--node-ip``, and the node's InternalIP turns public at the
    next kubelet restart."""
    retry = "nothing was changed; retry once the host's PrivateNetworkReady condition is True"
    if record is None or record.membership is VSwitchMembership.LEAVING:
        held = "holds no private network record" if record is None else f"is leaving vSwitch {record.vswitch_id}"
        return (
            f"host {host} {held} (status.privateNetwork) while its cluster has spec.privateNetwork: the run "
            f"would drop the node's VLAN interface and --node-ip; {retry}"
        )
    wanted = spec.vswitch.id or (cluster.vswitch_id if cluster is not None else None)
    if wanted is not None and wanted != record.vswitch_id:
        return f"host {host} is on vSwitch {record.vswitch_id}, its cluster on vSwitch {wanted}; {retry}"
    recorded_vlan = cluster.vlan if cluster is not None and cluster.vswitch_id == record.vswitch_id else None
    vlan = spec.vswitch.vlan or recorded_vlan
    if vlan is None:
        return f"the cluster has not read the VLAN of vSwitch {record.vswitch_id} yet; {retry}"
    return vlan_interface(spec, vlan, Allocated(ipaddress.IPv4Address(record.address), spec.network()))


def _spec_of(cluster: Mapping[str, Any]) -> PrivateNetworkSpec | None:
    raw = (cluster.get("spec") or {}).get("privateNetwork")
    if not raw:
        return None
    try:
        return PrivateNetworkSpec.model_validate(raw)
    except ValueError:  # pydantic's ValidationError is one; the other cluster's own admission speaks for it
        return None


def _vswitch_id(spec: PrivateNetworkSpec, cluster: Mapping[str, Any]) -> int | None:
    recorded = ((cluster.get("status") or {}).get("privateNetwork") or {}).get("vswitchID")
    return spec.vswitch.id if spec.vswitch.id is not None else recorded if isinstance(recorded, int) else None


def cluster_conflicts(
    spec: PrivateNetworkSpec, me: Mapping[str, Any], others: Iterable[Mapping[str, Any]]
) -> list[str]:
    """Why this cluster's private network clashes with another cluster's (any namespace): both would create
    the same VLAN (the second create is 409 VSWITCH_VLAN_NOT_UNIQUE), or both hand out the same addresses on
    one vSwitch (two nodes with one IP). Sharing a vSwitch with disjoint ranges is fine."""
    meta = me.get("metadata") or {}
    my_id = _vswitch_id(spec, me)
    first, last = spec.host_range()
    found: list[str] = []
    for other in others:
        om = other.get("metadata") or {}
        if (om.get("namespace"), om.get("name")) == (meta.get("namespace"), meta.get("name")):
            continue
        theirs = _spec_of(other)
        if theirs is None:
            continue
        who = f"HetznerGPUCluster {om.get('namespace')}/{om.get('name')}"
        if spec.vswitch.vlan is not None and spec.vswitch.vlan == theirs.vswitch.vlan:
            found.append(
                f"vswitch.vlan {spec.vswitch.vlan} is already requested by {who}: only one cluster creates a vSwitch; "
                "name it by id here (that cluster's status.privateNetwork.vswitchID) with a disjoint address range"
            )
            continue
        their_id = _vswitch_id(theirs, other)
        their_first, their_last = theirs.host_range()
        if my_id is not None and my_id == their_id and first <= their_last and their_first <= last:
            found.append(
                f"addresses {first}-{last} overlap {their_first}-{their_last} of {who} on vSwitch {my_id}: "
                "give each cluster on one vSwitch a disjoint range"
            )
    return found
