"""``netplan apply`` of a simulated host: the ``vlans:`` of ``/etc/netplan/*.yaml``, without the kernel's 802.1Q.

Why a stand-in: a simulated host shares the test machine's kernel, and that kernel has no 802.1Q support
(``CONFIG_VLAN_8021Q`` off, no loadable modules), so neither netplan's networkd nor ``ip link add ... type
vlan`` can make a VLAN device in a guest. An Ubuntu 24.04 image from installimage brings netplan, and the
node playbook's private_network role writes a netplan file and runs ``netplan apply``, as on a real server.
Here, each ``vlans:`` entry becomes a macvlan on its ``link``, under the name netplan would give it, with
the MTU, addresses and routes of the file; its VLAN id is recorded in the interface's alias
(``sim-vlan <id>``). The simulated switch (``capi_gpu_sim.private_link``) reads that alias where Robot's
switch reads the tag, and carries the interface's frames to the members of the vSwitch with that VLAN
only. Everything else about a VLAN interface (its name, MTU, addresses, routes, persistence in the file)
is what the real host gets.

Like netplan, ``apply`` removes a VLAN interface that no file defines any more, and leaves ``ethernets:``
alone here (the fleet configures eth0 before boot). ``generate [--root-dir DIR]`` checks the configuration
under DIR (``/`` by default) the way netplan's parser refuses it, and writes nothing (networkd's files are the
real netplan's business): a vlan needs an integer id and a ``link`` that names an interface the configuration
defines by its netplan id (``ethernets:`` key), not a kernel name that only a ``match:`` finds; ``apply``
refuses the same configuration before it touches anything. Runs inside the guest with python3 and PyYAML.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CONFIG_DIRS = (Path("/lib/netplan"), Path("/etc/netplan"), Path("/run/netplan"))
ALIAS = "sim-vlan "


def ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        sys.exit(f"netplan: ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


# The sections whose keys are netplan ids a vlan's link may name.
DEVICE_SECTIONS = ("ethernets", "bonds", "bridges", "vlans", "wifis", "vrfs", "modems", "tunnels")


def wanted(root: Path = Path("/")) -> dict[str, dict[str, Any]]:
    """The merged ``network.vlans`` of every config file under ``root``; a later file name overrides an earlier
    one, as in netplan. Exits (as netplan's parser does) on a vlan without an integer id or a defined link."""
    import yaml

    files: dict[str, Path] = {}
    for directory in CONFIG_DIRS:
        under = root / directory.relative_to("/")
        for path in sorted(under.glob("*.yaml")) if under.is_dir() else []:
            files[path.name] = path
    vlans: dict[str, dict[str, Any]] = {}
    defined: set[str] = set()
    where: dict[str, Path] = {}
    for name in sorted(files):
        doc = yaml.safe_load(files[name].read_text()) or {}
        network = doc.get("network") or {}
        for section in DEVICE_SECTIONS:
            defined.update(str(ifname) for ifname in network.get(section) or {})
        for ifname, spec in (network.get("vlans") or {}).items():
            if not isinstance(spec, dict) or not isinstance(spec.get("id"), int) or not spec.get("link"):
                sys.exit(f"netplan: {files[name]}: vlan {ifname} needs an integer id and a link")
            vlans[str(ifname)] = spec
            where[str(ifname)] = files[name]
    for ifname, spec in sorted(vlans.items()):
        if str(spec["link"]) not in defined:
            sys.exit(f"netplan: {where[ifname]}: {ifname}: interface '{spec['link']}' is not defined")
    return vlans


def live() -> dict[str, dict[str, Any]]:
    """Our VLAN interfaces now: name -> ``ip -d -j link`` entry."""
    links = json.loads(ip("-d", "-j", "link", "show") or "[]")
    return {str(x["ifname"]): x for x in links if str(x.get("ifalias", "")).startswith(ALIAS)}


def converge(name: str, spec: dict[str, Any], now: dict[str, Any] | None) -> None:
    alias = f"{ALIAS}{spec['id']}"
    if now is not None and (now.get("ifalias") != alias or now.get("link") != spec["link"]):
        ip("link", "del", name)
        now = None
    if now is None:
        ip("link", "add", "link", str(spec["link"]), "name", name, "type", "macvlan", "mode", "bridge")
        ip("link", "set", "dev", name, "alias", alias)
    ip("link", "set", "dev", name, "mtu", str(spec.get("mtu", 1500)), "up")
    have = json.loads(ip("-j", "-4", "addr", "show", "dev", name) or "[]")
    present = {f"{a['local']}/{a['prefixlen']}" for x in have for a in x.get("addr_info", [])}
    addresses = {str(a) for a in spec.get("addresses") or []}
    for address in sorted(present - addresses):
        ip("addr", "del", address, "dev", name)
    for address in sorted(addresses - present):
        ip("addr", "add", address, "dev", name)
    for route in spec.get("routes") or []:
        ip("route", "replace", str(route["to"]), "via", str(route["via"]), "dev", name)


def apply() -> None:
    vlans, now = wanted(), live()
    for name in sorted(set(now) - set(vlans)):
        ip("link", "del", name, check=False)
    for name, spec in sorted(vlans.items()):
        converge(name, spec, now.get(name))


def main(argv: list[str]) -> int:
    if argv[1:2] == ["apply"]:
        apply()
        return 0
    if argv[1:2] == ["generate"]:
        rest = argv[2:]
        if rest and rest[0].startswith("--root-dir="):
            rest = ["--root-dir", rest[0].removeprefix("--root-dir="), *rest[1:]]
        if rest == []:
            wanted()  # parses and checks; networkd's files are the real netplan's business
            return 0
        if len(rest) == 2 and rest[0] == "--root-dir" and rest[1]:
            wanted(Path(rest[1]))
            return 0
    print("netplan (simulated): only 'apply' and 'generate [--root-dir DIR]'", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
