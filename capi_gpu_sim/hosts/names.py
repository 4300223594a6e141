"""Every name and address the simulated fleet creates on the test machine, derived in one place.

Why one module: teardown and the stale-leftover sweep find things *by name*. If the fleet and the
sweeper spelled prefixes separately, a crashed run could leave a namespace the sweeper doesn't know.
So netns, veth, cgroup and state-directory names, and the private addresses, all come from here.

Addressing: fleet slot ``n`` (1..200) owns ``10.231.n.0/24``; host ``i`` (0..63) of that fleet gets the
/30 ``10.231.n.4i``: ``.4i+1`` on the test machine's end of the veth, ``.4i+2`` inside the host. Only
these addresses, inside namespaces the fleet made, are ever targets.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PREFIX: Final = "capigpu"  # netns names, cgroup dir, registry files
LINK_PREFIX: Final = "cgpu"  # veth names (IFNAMSIZ is 16 with NUL: keep them short)
NET_BASE: Final = "10.231"
MAX_SLOT: Final = 200
MAX_HOSTS: Final = 64
RUN_DIR: Final = Path("/run/capi-gpu-sim")
DEFAULT_STATE_ROOT: Final = Path("/var/tmp/capi-gpu-sim")


@dataclass(frozen=True)
class HostNames:
    """Names and addresses of host ``index`` in fleet ``slot``."""

    slot: int
    index: int

    def __post_init__(self) -> None:
        if not 1 <= self.slot <= MAX_SLOT:
            raise ValueError(f"fleet slot {self.slot} outside 1..{MAX_SLOT}")
        if not 0 <= self.index < MAX_HOSTS:
            raise ValueError(f"host index {self.index} outside 0..{MAX_HOSTS - 1}")

    @property
    def key(self) -> str:
        return f"f{self.slot}-h{self.index}"

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.key}"

    @property
    def veth_host(self) -> str:
        return f"{LINK_PREFIX}{self.slot}h{self.index}"

    @property
    def veth_peer_tmp(self) -> str:
        """The guest end's name before it moves into the namespace (renamed ``eth0`` there)."""
        return f"{LINK_PREFIX}{self.slot}h{self.index}p"

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{NET_BASE}.{self.slot}.{4 * self.index}/30")

    @property
    def host_ip(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def guest_ip(self) -> str:
        return str(self.network.network_address + 2)

    @property
    def cgroup_name(self) -> str:
        return self.key

    def private_port(self, vlan: int) -> tuple[str, str]:
        """This host's port on the private link of the vSwitch with ``vlan``: a veth pair on the test machine,
        (the end enslaved to the link's bridge, the end its frames are redirected through)."""
        return f"{LINK_PREFIX}{self.slot}p{self.index}v{vlan}", f"{LINK_PREFIX}{self.slot}q{self.index}v{vlan}"


def private_bridge(slot: int, vlan: int) -> str:
    """The bridge of fleet ``slot``'s private link for the vSwitch with ``vlan`` (capi_gpu_sim.private_link)."""
    return f"{LINK_PREFIX}{slot}b{vlan}"


def fleet_network(slot: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{NET_BASE}.{slot}.0/24")


def slot_of_netns(name: str) -> int | None:
    """The fleet slot encoded in one of our netns names, or None if the name isn't ours."""
    if not name.startswith(f"{PREFIX}-f"):
        return None
    head = name[len(PREFIX) + 2 :].split("-", 1)[0]
    return int(head) if head.isdigit() else None


_OUR_LINK = re.compile(rf"^{LINK_PREFIX}([0-9]+)[a-z]")


def slot_of_link(name: str) -> int | None:
    """The slot of any link the fleet makes: a host's veth (``h``), a private link's bridge (``b``) or ports."""
    found = _OUR_LINK.match(name)
    return int(found.group(1)) if found else None


def slot_of_cgroup(name: str) -> int | None:
    if not name.startswith("f"):
        return None
    head = name[1:].split("-", 1)[0]
    return int(head) if head.isdigit() else None
