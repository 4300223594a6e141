"""Network plumbing for one simulated host: a named netns and a veth pair on a private /30.

Why `ip` and not a netlink library: iproute2 is what the recipe was measured with, it is on every
Debian box, and its failures read like the documentation. Every call is bounded by a timeout and every
creation has an idempotent removal, because teardown must also work on half-built leftovers.

Before anything is created the fleet's /24 is checked against the routing table: if another interface
already routes it, the fleet refuses to start rather than shadow someone else's network.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path

from capi_gpu_sim.hosts import names

IP_TIMEOUT_S = 20.0


class NetError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    if check and proc.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def list_netns() -> list[str]:
    base = Path("/run/netns")
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def list_links() -> list[str]:
    out = _ip("-j", "link", "show").stdout
    return [str(link["ifname"]) for link in json.loads(out or "[]")]


def check_network_free(slot: int) -> None:
    """Refuse a fleet slot whose /24 is already routed by an interface that isn't ours."""
    net = names.fleet_network(slot)
    routes = json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]")
    for route in routes:
        dst = route.get("dst", "")
        if dst in ("", "default") or route.get("type") in ("local", "broadcast"):
            continue
        try:
            other = ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False)
        except ValueError:
            continue
        dev = str(route.get("dev", ""))
        if other.overlaps(net) and names.slot_of_link(dev) != slot:
            raise NetError(f"{net} overlaps existing route {dst} on {dev}; refusing to use fleet slot {slot}")


def create(host: names.HostNames) -> None:
    """netns + veth + addresses; the guest end is called ``eth0`` inside the namespace."""
    delete(host)
    _ip("netns", "add", host.netns)
    try:
        _ip("link", "add", host.veth_host, "type", "veth", "peer", "name", host.veth_peer_tmp)
        _ip("link", "set", host.veth_peer_tmp, "netns", host.netns)
        ns = ("-n", host.netns)
        _ip(*ns, "link", "set", host.veth_peer_tmp, "name", "eth0")
        _ip("addr", "add", f"{host.host_ip}/30", "dev", host.veth_host)
        # A guest's default route points at us; never let its packets be forwarded further.
        Path(f"/proc/sys/net/ipv4/conf/{host.veth_host}/forwarding").write_text("0\n")
        _ip("link", "set", host.veth_host, "up")
        _ip(*ns, "addr", "add", f"{host.guest_ip}/30", "dev", "eth0")
        _ip(*ns, "link", "set", "eth0", "up")
        _ip(*ns, "link", "set", "lo", "up")
        _ip(*ns, "route", "add", "default", "via", host.host_ip)
    except NetError:
        delete(host)
        raise


def delete(host: names.HostNames) -> None:
    delete_by_name(host.netns, host.veth_host)


def delete_by_name(netns: str | None, link: str | None) -> None:
    """Remove whatever of the pair exists; deleting either veth end deletes both."""
    if link and link in list_links():
        _ip("link", "del", link, check=False)
    if netns and netns_exists(netns):
        _ip("netns", "del", netns, check=False)
        if netns_exists(netns):
            # A process still holds the namespace's mount; the file goes once it's gone.
            Path("/run/netns", netns).unlink(missing_ok=True)


def netns_inode(name: str) -> int | None:
    try:
        return Path("/run/netns", name).stat().st_ino
    except OSError:
        return None
