"""The simulated hosts' private link: what Robot's switch does for a vSwitch, on the test machine.

On Robot, the servers of a vSwitch share one layer-2 network: frames a server sends tagged with the
vSwitch's VLAN reach the other *ready* members, and nobody else. Here every host is a netns with one veth
to the test machine (``hosts.netns``), so the fleet plays the switch:

- per vSwitch with at least one port, a Linux bridge in the test machine's namespace, with no address
  (``names.private_bridge``: nothing on the test machine is on the link);
- per ready member, a port: a veth pair, one end enslaved to that bridge (``HostNames.private_port``), and
  two ``tc`` redirects: the frames the host sends from its VLAN interface go from its veth into the pair,
  and what the bridge sends out of the pair goes back into the host's veth.

The test machine's kernel has no 802.1Q (``CONFIG_VLAN_8021Q`` off, no modules), so a guest's VLAN
interface is the netplan stand-in's macvlan (``host_shims.netplan``), whose alias ``sim-vlan <id>`` stands
for the tag: the port matches that interface's MAC, and only on the vSwitch with that VLAN. A server that
is not a ready member (never added, still ``processing``, ``failed``, leaving) has no port: its frames reach
the test machine's own stack, which has no address on the link, and go nowhere.

``plan`` (pure) compares the ports that exist with the ports that should: from the Robot simulator's
``vswitch_links()`` and each member's VLAN interfaces; ``PrivateLinks.sync`` applies the difference, and
its thread runs it every ``interval_s`` (membership changes on the Robot simulator's clock, interfaces
when a playbook runs). Everything is named by the fleet's slot, so ``hosts.registry`` removes what a
crashed run left.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from capi_gpu_sim.hosts import names, netns

if TYPE_CHECKING:
    from capi_gpu_sim.hosts.host import Host

log = logging.getLogger(__name__)

ALIAS_PREFIX: Final = "sim-vlan "  # host_shims.netplan writes it on the VLAN interfaces it makes
TC_TIMEOUT_S: Final = 20.0


@dataclass(frozen=True, order=True)
class Port:
    """Host ``index``'s port on the link of the vSwitch with ``vlan``, for its VLAN interface with ``mac``."""

    vlan: int
    index: int
    mac: str


@dataclass(frozen=True)
class Change:
    remove: tuple[Port, ...] = ()
    add: tuple[Port, ...] = ()
    bridges_up: tuple[int, ...] = ()  # VLANs whose bridge must exist before the adds
    bridges_down: tuple[int, ...] = ()  # VLANs whose bridge has no port left after the removals

    @property
    def empty(self) -> bool:
        return not (self.remove or self.add or self.bridges_up or self.bridges_down)


def desired(
    links: Mapping[int, tuple[int, set[int]]],
    hosts: Mapping[int, int],
    interfaces: Mapping[int, Mapping[int, str]],
) -> set[Port]:
    """The ports there should be.

    ``links``: vSwitch id -> (VLAN, ready member server numbers), as the Robot simulator says;
    ``hosts``: server number -> host index in this fleet (members outside the fleet have no machine);
    ``interfaces``: server number -> {VLAN: MAC} of the host's VLAN interfaces now.
    """
    out: set[Port] = set()
    for vlan, members in links.values():
        for number in members:
            index, mac = hosts.get(number), interfaces.get(number, {}).get(vlan)
            if index is not None and mac is not None:
                out.add(Port(vlan, index, mac))
    return out


def plan(current: Iterable[Port], wanted: Iterable[Port], bridges: Iterable[int]) -> Change:
    """What to remove and add to go from ``current`` ports (and existing ``bridges``) to ``wanted``.
    A port whose MAC changed (the interface was made again) is removed and added."""
    have, want, up = set(current), set(wanted), set(bridges)
    keep_vlans = {p.vlan for p in want}
    return Change(
        remove=tuple(sorted(have - want)),
        add=tuple(sorted(want - have)),
        bridges_up=tuple(sorted(keep_vlans - up)),
        bridges_down=tuple(sorted((up | {p.vlan for p in have}) - keep_vlans)),
    )


def vlan_interfaces(ip_link_json: str) -> dict[int, str]:
    """{VLAN: MAC} of the VLAN interfaces in a host's ``ip -j link show`` (the netplan stand-in's alias)."""
    found: dict[int, str] = {}
    for link in json.loads(ip_link_json or "[]"):
        alias = str(link.get("ifalias", ""))
        vlan = alias.removeprefix(ALIAS_PREFIX)
        if alias.startswith(ALIAS_PREFIX) and vlan.isdigit() and "UP" in link.get("flags", []):
            found[int(vlan)] = str(link.get("address", ""))
    return found


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=TC_TIMEOUT_S, check=False)
    if check and proc.returncode != 0:
        raise netns.NetError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc


@dataclass
class PrivateLinks:
    """The fleet's private links. ``links`` reads the Robot simulator (``RobotSim.vswitch_links``),
    ``hosts`` the fleet's machines (server number -> names); both are called from the sync thread."""

    slot: int
    links: Callable[[], Mapping[int, tuple[int, set[int]]]]
    hosts: Callable[[], Mapping[int, names.HostNames]]
    interval_s: float = 0.5
    ports: set[Port] = field(default_factory=set)
    bridges: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> PrivateLinks:
        self._thread = threading.Thread(target=self._loop, name="private-links", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync()
            except Exception:  # a host rebooting mid-read: the next pass sees it settled
                log.exception("private links: sync failed; retrying")

    def sync(self) -> Change:
        """Make the ports match Robot's ready members now; returns what was changed."""
        with self._lock:
            hosts = self.hosts()
            links = self.links()
            members = {n for _, ready in links.values() for n in ready if n in hosts}
            interfaces = {n: self._interfaces(hosts[n]) for n in members}
            change = plan(self.ports, desired(links, {n: h.index for n, h in hosts.items()}, interfaces), self.bridges)
            self._apply(change)
            return change

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            self._apply(plan(self.ports, (), self.bridges))

    @staticmethod
    def _interfaces(host: names.HostNames) -> dict[int, str]:
        if not netns.netns_exists(host.netns):
            return {}
        proc = _run("ip", "-n", host.netns, "-j", "link", "show", check=False)
        return vlan_interfaces(proc.stdout) if proc.returncode == 0 else {}

    def _apply(self, change: Change) -> None:
        for port in change.remove:
            self._detach(port)
            self.ports.discard(port)
        for vlan in change.bridges_down:
            netns.delete_by_name(None, names.private_bridge(self.slot, vlan))
            self.bridges.discard(vlan)
        for vlan in change.bridges_up:
            bridge = names.private_bridge(self.slot, vlan)
            netns.delete_by_name(None, bridge)
            # No netfilter on the link: the test machine's firewall is not Robot's switch.
            _run("ip", "link", "add", bridge, "type", "bridge", *_NO_NETFILTER)
            _run("ip", "link", "set", bridge, "up")
            self.bridges.add(vlan)
        for port in change.add:
            self._attach(port)
            self.ports.add(port)

    def _attach(self, port: Port) -> None:
        host = names.HostNames(self.slot, port.index)
        bridge_end, redirect_end = host.private_port(port.vlan)
        netns.delete_by_name(None, bridge_end)
        _run("ip", "link", "add", bridge_end, "type", "veth", "peer", "name", redirect_end)
        _run("ip", "link", "set", bridge_end, "master", names.private_bridge(self.slot, port.vlan))
        _run("ip", "link", "set", bridge_end, "up")
        _run("ip", "link", "set", redirect_end, "up")
        # The host's frames from its VLAN interface (by MAC) into the link; one filter per VLAN (its pref).
        _run("tc", "qdisc", "replace", "dev", host.veth_host, "clsact")
        _run("tc", "filter", "del", "dev", host.veth_host, "ingress", "pref", str(port.vlan), check=False)
        _run(
            "tc", "filter", "add", "dev", host.veth_host, "ingress", "pref", str(port.vlan), "protocol", "all",
            "u32", "match", "ether", "src", port.mac, "action", "mirred", "egress", "redirect", "dev", redirect_end,
        )  # fmt: skip
        # Whatever the bridge sends to this port, back to the host.
        _run("tc", "qdisc", "replace", "dev", redirect_end, "clsact")
        _run(
            "tc", "filter", "add", "dev", redirect_end, "ingress", "pref", "1", "protocol", "all",
            "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", host.veth_host,
        )  # fmt: skip

    def _detach(self, port: Port) -> None:
        host = names.HostNames(self.slot, port.index)
        if host.veth_host in netns.list_links():
            _run("tc", "filter", "del", "dev", host.veth_host, "ingress", "pref", str(port.vlan), check=False)
        netns.delete_by_name(None, host.private_port(port.vlan)[0])  # takes its peer along


_NO_NETFILTER: Final = ("nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0")


PROBE = (
    "import socket,sys\n"
    "s=socket.socket();s.settimeout(float(sys.argv[2]))\n"
    "try:\n s.connect((sys.argv[1],22));print('reached')\n"
    "except ConnectionRefusedError:print('reached')\n"  # a RST came back: the peer answered on the link
    "except OSError:print('unreachable')\n"
)


def reaches(host: Host, address: str, timeout_s: float = 1.5) -> bool:
    """From inside ``host``'s guest, whether ``address`` answers on TCP 22 (a RST counts: the peer answered on the
    link). No ping here: the guests and the test machine have none."""
    proc = host.exec(["python3", "-c", PROBE, address, str(timeout_s)], timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"probe in {host.name} failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode().strip() == "reached"
