"""The private network over a simulated vSwitch, with real Ansible: three installed GEX131s, two of them added
to a vSwitch through the Robot simulator's API; the shipped private_network role (roles/ of playbooks/, run
alone) writes each host's VLAN interface (netplan file, applied now) with its own address. While the members
are ``processing`` nobody reaches anybody; once Robot says ``ready``, the two members reach each other over
their private addresses from inside their namespaces, and the third host (VLAN interface configured, not a
member) reaches neither and is reached by neither. A second run of the role changes nothing. After a reboot the interface comes back from the netplan file and
the link follows it. A member removed
from the vSwitch loses the link at once (leaving). Closing the fleet removes the link's bridge and ports. A /32
route is among the routes (ip prints it without its /32). A host whose netplan configuration would refuse the
role's file (the VLAN's link names no interface of it) fails the play at the check and keeps /etc/netplan as it
was."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from capi_gpu.provisioning import ansible, ansible_events, private_network
from capi_gpu_sim.fleet import Fleet, FleetConfig
from capi_gpu_sim.hosts import host as simhost
from capi_gpu_sim.hosts import keys, names, netns, registry, targets
from capi_gpu_sim.private_link import reaches
from capi_gpu_sim.robot import RobotSim

VLAN = 4000
ADDRESSES = ("10.0.1.10", "10.0.1.11", "10.0.1.12")
# A /32 among them: ip -j route prints its dst without the /32, and the role must still see it in place.
ROUTES = ("10.0.0.0/16", "10.0.2.7/32")


def install_os(host: simhost.Host, hostname: str, host_key: keys.KeyPair, client: keys.KeyPair) -> None:
    """What installimage and the post-install step leave on the disk: hostname, OS host key, root's key."""
    for sub in ("upper", "work"):
        shutil.rmtree(host.disk_dir / sub)
        (host.disk_dir / sub).mkdir(mode=0o755)
    upper = host.disk_dir / "upper"
    (upper / "etc" / "ssh").mkdir(parents=True)
    (upper / "etc" / "hostname").write_text(hostname + "\n")
    key = upper / "etc" / "ssh" / "ssh_host_ed25519_key"
    key.write_text(host_key.private_openssh)
    key.chmod(0o600)
    (upper / "etc" / "ssh" / "ssh_host_ed25519_key.pub").write_text(host_key.public_line + "\n")
    dot_ssh = upper / "root" / ".ssh"
    dot_ssh.mkdir(parents=True, mode=0o700)
    os.chmod(upper / "root", 0o700)
    (dot_ssh / "authorized_keys").write_text(client.public_line + "\n")
    (host.disk_dir / "installed.json").write_text(json.dumps({"hostname": hostname}))


def installed_host(fleet: Fleet, index: int) -> tuple[simhost.Host, ansible.SSHTarget]:
    host = fleet.add_host(3_200_001 + index)  # registered with Robot under the address it answers on
    assert host.wait_up(timeout=60), "previous OS did not boot"
    host.power_off(hard=True)
    assert host.wait_state(simhost.State.OFF, timeout=60)
    host_key, client = keys.generate(), keys.generate()
    install_os(host, f"gex131-{index}", host_key, client)
    count = host.boot_count()
    host.power_on(targets.DiskBoot())
    assert host.wait_up(timeout=60, after_boot=count), "installed OS did not boot"
    pin = " ".join(host_key.public_line.split()[:2])
    return host, ansible.SSHTarget(f"gex131-{index}", host.guest_ip, pin, client.private_openssh)


def wait_for(condition: object, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def role_runner(tmp_path: Path) -> ansible.AnsibleRunner:
    """The shipped roles (linked, not copied) under a play that runs only private_network."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "roles").symlink_to(ansible.default_playbook_dir() / "roles")
    play = [{"name": "Private network", "hosts": "all", "gather_facts": False, "roles": [{"role": "private_network"}]}]
    (project / "private-network.yml").write_text(yaml.safe_dump(play))
    return ansible.AnsibleRunner(
        artifacts_root=tmp_path / "artifacts", playbook_dir=project, playbook="private-network.yml", timeout_s=300
    )


@pytest.fixture
def fleet(robot: RobotSim) -> Iterator[Fleet]:
    with Fleet(FleetConfig(hosts=0, private_links=True, private_link_interval_s=0.2), robot=robot) as f:
        yield f


async def test_two_vswitch_members_reach_each_other_privately_and_a_third_host_does_not(
    robot: RobotSim, fleet: Fleet, role_runner: ansible.AnsibleRunner, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    nodes = [installed_host(fleet, i) for i in range(3)]
    (a, _), (b, _), (c, _) = nodes
    http = httpx.AsyncClient(base_url=robot.url, auth=(robot.username, robot.password), timeout=10)
    request.addfinalizer(lambda: asyncio.run(http.aclose()))
    # Robot's settle time, long enough at the clock's compression that "processing" is seen; advanced below.
    robot.vswitches.delay_s = 100 * 3600.0
    created = await http.post("/vswitch", data={"name": "gpu-net", "vlan": str(VLAN)})
    assert created.status_code == 201, created.text
    vid = created.json()["id"]
    joined = await http.post(f"/vswitch/{vid}/server", data={"server[]": [str(a.server_number), str(b.server_number)]})
    assert joined.status_code == 201, joined.text

    async def run_all() -> list[ansible_events.PlaybookResult]:
        runs = [
            role_runner.run_playbook(
                target,
                private_network.VLANInterface(VLAN, 1400, f"{ADDRESSES[i]}/24", "10.0.1.1", ROUTES).playbook_vars(),
            )
            for i, (_, target) in enumerate(nodes)
        ]
        return list(await asyncio.gather(*runs))

    first = await run_all()
    for result in first:
        assert result.status is ansible_events.RunStatus.SUCCEEDED, result.failed
        assert result.changed == 2, "the netplan file and netplan apply"
    netplan = yaml.safe_load(a.exec(["cat", "/etc/netplan/60-capi-gpu-vswitch.yaml"]).stdout)
    assert netplan["network"]["vlans"] == {
        f"eth0.{VLAN}": {
            "id": VLAN,
            "link": "eth0",
            "mtu": 1400,
            "addresses": ["10.0.1.10/24"],
            "routes": [{"to": route, "via": "10.0.1.1"} for route in ROUTES],
        }
    }
    link = json.loads(c.exec(["ip", "-j", "addr", "show", "dev", f"eth0.{VLAN}"]).stdout)[0]
    assert link["mtu"] == 1400 and link["addr_info"][0]["local"] == "10.0.1.12", "the third host is configured too"

    assert not reaches(a, ADDRESSES[1], 1.0), "members still processing share no link yet"
    robot.clock.advance(robot.vswitches.delay_s)
    assert robot.wait_idle()
    assert wait_for(lambda: reaches(a, ADDRESSES[1])), "the ready members never reached each other"
    assert reaches(b, ADDRESSES[0])
    for outsider_probe in ((c, ADDRESSES[0]), (c, ADDRESSES[1]), (a, ADDRESSES[2]), (b, ADDRESSES[2])):
        assert not reaches(*outsider_probe), f"{outsider_probe[0].name} -> {outsider_probe[1]} crossed the vSwitch"

    second = await run_all()
    assert [r.changed for r in second] == [0, 0, 0], [r.failed for r in second]

    # A reboot brings the interface back from the netplan file (a new interface: the link follows it).
    count = a.boot_count()
    a.exec(["systemctl", "reboot"], timeout=30)
    assert a.wait_up(timeout=60, after_boot=count), "the member did not come back from its reboot"
    assert wait_for(lambda: reaches(a, ADDRESSES[1])), "the VLAN interface did not come back at boot"

    left = await http.request("DELETE", f"/vswitch/{vid}/server", data={"server[]": [str(b.server_number)]})
    assert left.status_code == 200, left.text
    assert wait_for(lambda: not reaches(a, ADDRESSES[1], 1.0)), "a server leaving the vSwitch kept its link"

    slot = fleet.slot
    assert names.private_bridge(slot, VLAN) in netns.list_links()
    fleet.close()
    assert not registry.leftovers(slot)["links"], "the private link outlived the fleet"
    print(f"\nprivate link e2e: {time.monotonic() - started:.1f} s for 3 hosts")


async def test_a_netplan_file_netplan_refuses_is_never_installed(
    fleet: Fleet, role_runner: ansible.AnsibleRunner
) -> None:
    """The role checks its file with netplan generate on a scratch copy of the host's configuration before it
    installs it: here installimage's file keys the NIC by an id that matches it (not by its kernel name), so
    the VLAN's link names no interface of the configuration and netplan refuses it. The play fails at that check
    and /etc/netplan is as it was, so the next boot's netplan generate still configures the main NIC."""
    host, target = installed_host(fleet, 0)
    netcfg = b"network: {version: 2, renderer: networkd, ethernets: {mainnic: {match: {name: eth0}}}}\n"
    assert host.exec(["tee", "/etc/netplan/01-netcfg.yaml"], stdin=netcfg).returncode == 0
    before = host.exec(["ls", "/etc/netplan"]).stdout
    interface = private_network.VLANInterface(VLAN, 1400, f"{ADDRESSES[0]}/24", "10.0.1.1", ROUTES)

    result = await role_runner.run_playbook(target, interface.playbook_vars())
    assert result.status is ansible_events.RunStatus.FAILED and result.failed is not None
    assert result.failed.task == "Check netplan takes the configuration with it", result.failed
    assert "interface 'eth0' is not defined" in result.failed.message
    assert host.exec(["ls", "/etc/netplan"]).stdout == before, "the refused file stayed in /etc/netplan"
    assert host.exec(["netplan", "generate"]).returncode == 0, "the next boot's netplan generate fails"
    assert not host.exec(["sh", "-c", "ls -d /tmp/capi-gpu-netplan-*"]).stdout, "the scratch root was left"
    assert host.exec(["ip", "link", "show", f"eth0.{VLAN}"]).returncode != 0
