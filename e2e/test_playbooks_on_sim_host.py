"""site.yml for real, through ansible-runner, on a simulated GEX131 (systemd as PID 1, own sshd, pinned
host key, the local stand-in apt repository): every role runs; layout {1g.24gb: 2, 2g.48gb: 1} leaves exactly
those instances in the GPU shim; a second run changes nothing; a reboot re-creates the instances from the
boot unit before kubelet starts; the nvidia-dkms route takes every driver package from NVIDIA's repository (its
apt pin), though the archive's build of the same names sorts higher; a reset that cannot apply MIG mode asks for one reboot; a failed task is
reported with its role and task; a host whose key is not the pinned one is refused; the default route copies
the nvidia-mig-parted the operator ships (built from pinned source), checks its sha256 on the host and refuses
a copy with another; a .deb fetched by URL with a wrong pinned checksum stops the play before anything is
installed, with the right one it is used; MIG can be turned off again (the whole GPU)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from capi_gpu import domain
from capi_gpu.gpu import catalog, migparted
from capi_gpu.provisioning import ansible, ansible_data, ansible_events, playbook_vars, shipped_mig_parted
from capi_gpu_sim import aptrepo, binaries, fleet
from capi_gpu_sim.hosts import host as simhost
from capi_gpu_sim.hosts import keys, targets

pytestmark = pytest.mark.e2e

KUBERNETES_VERSION = "v1.36.3"
LAYOUT = {"1g.24gb": 2, "2g.48gb": 1}
Phase = ansible_events.TaskPhase


@dataclass(frozen=True)
class World:
    fleet: fleet.Fleet
    repo: aptrepo.AptRepo


@dataclass
class Node:
    host: simhost.Host
    target: ansible.SSHTarget
    runner: ansible.AnsibleRunner

    def sh(self, *argv: str, ok: bool = True) -> str:
        proc = self.host.exec(list(argv), timeout=60)
        if ok:
            assert proc.returncode == 0, f"{argv}: {proc.stderr.decode(errors='replace')}"
        return proc.stdout.decode(errors="replace")

    def mig_devices(self) -> Counter[str]:
        return Counter(re.findall(r"MIG\s+(\S+)\s+Device", self.sh("nvidia-smi", "-L")))

    def reboot(self) -> None:
        count = self.host.boot_count()
        self.host.exec(["systemctl", "reboot"], timeout=30)
        assert self.host.wait_up(timeout=120, after_boot=count), "host did not come back from the reboot"

    def wait_active(self, unit: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.sh("systemctl", "is-active", unit, ok=False).strip()
            if state in ("active", "failed"):
                break
            time.sleep(0.2)
        assert state == "active", f"{unit} is {state}: {self.sh('systemctl', 'status', unit, ok=False)}"

    def monotonic(self, unit: str, prop: str) -> int:
        return int(self.sh("systemctl", "show", "-p", prop, "--value", unit).strip())


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    repo = aptrepo.ensure_repo(KUBERNETES_VERSION, "580")
    with fleet.Fleet(fleet.FleetConfig(hosts=0, first_server_number=2_100_001, apt_repo=repo)) as sim:
        yield World(sim, repo)


def install_os(host: simhost.Host, hostname: str, host_key: keys.KeyPair, client: keys.KeyPair) -> None:
    """What installimage and our post-install step leave on the disk (a fresh image, the hostname, the
    OS host key the controller generated, root's authorized key), written while the host is off."""
    for sub in ("upper", "work"):
        shutil.rmtree(host.disk_dir / sub)
        (host.disk_dir / sub).mkdir(mode=0o755)
    upper = host.disk_dir / "upper"
    (upper / "etc" / "ssh").mkdir(parents=True)
    (upper / "etc" / "hostname").write_text(hostname + "\n")
    (upper / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n")
    key = upper / "etc" / "ssh" / "ssh_host_ed25519_key"
    key.write_text(host_key.private_openssh)
    key.chmod(0o600)
    (upper / "etc" / "ssh" / "ssh_host_ed25519_key.pub").write_text(host_key.public_line + "\n")
    dot_ssh = upper / "root" / ".ssh"
    dot_ssh.mkdir(parents=True, mode=0o700)
    os.chmod(upper / "root", 0o700)
    (dot_ssh / "authorized_keys").write_text(client.public_line + "\n")
    (dot_ssh / "authorized_keys").chmod(0o600)
    (host.disk_dir / "installed.json").write_text(json.dumps({"hostname": hostname}))


@pytest.fixture
def node_factory(world: World, tmp_path: Path) -> Iterator[Any]:
    made: list[simhost.Host] = []

    def make(gpu_knobs: dict[str, Any] | None = None) -> Node:
        number = world.fleet.config.first_server_number + len(world.fleet.hosts)
        host = world.fleet.add_host(number, register=False)  # boots the server's previous OS
        made.append(host)
        assert host.wait_up(timeout=120), "previous OS did not boot"
        host.power_off(hard=True)
        assert host.wait_state(simhost.State.OFF, timeout=60)
        host_key, client = keys.generate(), keys.generate()
        name = f"gex131-{len(made)}"
        install_os(host, name, host_key, client)  # the fleet binds the apt repository into every disk boot
        if gpu_knobs:
            lib = host.disk_dir / "upper" / "var" / "lib" / "gpu-shim"
            lib.mkdir(parents=True)
            (lib / "config.json").write_text(json.dumps(gpu_knobs))
        count = host.boot_count()
        host.power_on(targets.DiskBoot())
        assert host.wait_up(timeout=120, after_boot=count), "installed OS did not boot"
        pin = " ".join(host_key.public_line.split()[:2])
        target = ansible.SSHTarget(name, host.guest_ip, pin, client.private_openssh)
        runner = ansible.AnsibleRunner(artifacts_root=tmp_path / "artifacts", timeout_s=900)
        return Node(host, target, runner)

    yield make
    for host in made:
        host.power_off(hard=True)


def site_vars(
    repo: aptrepo.AptRepo, mig: playbook_vars.MigLayoutVars | None = None, route: str | None = "nvidia-dkms"
) -> playbook_vars.PlaybookVars:
    """The extra vars; NVIDIA's DKMS route unless told (None: the role's default, auto, which picks Ubuntu's
    precompiled module wherever the archive has it, as the simulated one does)."""
    model = catalog.builtin_catalog().model("rtx-pro-6000")
    return playbook_vars.PlaybookVars(
        kubernetes_version=KUBERNETES_VERSION,
        mig=mig or playbook_vars.MigLayoutVars.render(model, migparted.resolve(model, LAYOUT)),
        driver_route=route,  # type: ignore[arg-type]  # one of the Literal's values, or None
        **aptrepo.playbook_repositories(repo),  # type: ignore[arg-type]
        **shipped_mig_parted.overrides(binaries.ensure_mig_parted()),  # what the world's operator ships
    )


async def test_a_gex131_is_provisioned_idempotently_and_keeps_its_layout_across_reboots(
    world: World, node_factory: Any
) -> None:
    node: Node = node_factory()
    events: list[ansible_events.TaskEvent] = []
    started = time.monotonic()
    first = await node.runner.prepare_node(node.target, site_vars(world.repo), events.append)
    first_s = time.monotonic() - started
    assert first.status is ansible_events.RunStatus.SUCCEEDED, first.failed
    assert {e.role for e in events if e.phase is Phase.STARTED} >= {
        "nvidia_driver",
        "container_toolkit",
        "mig_layout",
        "dra_node",
        "kubelet",
    }
    assert node.mig_devices() == Counter(LAYOUT)
    assert node.sh("nvidia-smi", "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader").strip() == (
        "Enabled, Enabled"
    )
    # What the other roles leave behind, as the node's own tools see it.
    cdi = yaml.safe_load(node.sh("cat", "/etc/cdi/nvidia.yaml"))
    assert sum(1 for d in cdi["devices"] if d["name"].startswith("MIG-")) == 3, "CDI spec regenerated after MIG"
    effective = json.loads(node.sh("cat", "/run/containerd/sim-effective.json"))
    assert effective == {"version": 3, "cri": True, "enable_cdi": True, "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"]}
    assert node.sh("systemctl", "is-active", "nvidia-persistenced.service").strip() == "active"
    assert node.sh("systemctl", "is-enabled", "kubelet.service").strip() == "enabled"
    assert node.sh("systemctl", "is-active", "kubelet.service", ok=False).strip() == "inactive"
    assert node.sh("systemctl", "is-enabled", "nvidia-mig-manager.service", ok=False).strip() == "masked"
    # One driver source: NVIDIA's build of every driver package, though the archive's own sorts higher.
    status = node.sh("dpkg-query", "-W", "-f=${db:Status-Status} ${Package} ${Version}\n", "*nvidia*580*")
    drivers = dict(line.split()[1:] for line in status.splitlines() if line.startswith("installed "))
    assert "nvidia-driver-pinning-580" in drivers and len(drivers) >= 7, drivers
    assert not [v for v in drivers.values() if "ubuntu" in v], drivers
    assert "l=NVIDIA CUDA" in node.sh("cat", "/etc/apt/preferences.d/capi-gpu-nvidia-cuda.pref")
    # The shipped nvidia-mig-parted, copied and checked: the same bytes, runnable on the host.
    shipped = binaries.ensure_mig_parted()
    assert node.sh("sha256sum", "/usr/local/bin/nvidia-mig-parted").split()[0] == shipped_mig_parted.sha256_of(shipped)
    assert "version v0.15.0" in node.sh("/usr/local/bin/nvidia-mig-parted", "--version")
    node.sh("sha256sum", "--check", "--strict", "/etc/capi-gpu/nvidia-mig-parted.sha256")
    assert node.sh("dpkg-query", "-W", "nvidia-mig-manager", ok=False) == "", "the default route installs no .deb"
    assert "hold" in node.sh("dpkg", "--get-selections", "kubelet", "kubeadm", "kubectl")
    assert node.sh("dpkg-query", "-W", "-f=${Version}", "kubelet") == "1.36.3-1.1"
    assert "--node-labels=nvidia.com/gpu.present=true" in node.sh("cat", "/etc/default/kubelet")
    node.sh("test", "-d", f"/var/lib/kubelet/plugins/{domain.GATE_DRIVER}")
    assert node.sh("cat", "/proc/sys/net/ipv4/ip_forward").strip() == "1"

    second = await node.runner.prepare_node(node.target, site_vars(world.repo))
    assert second.status is ansible_events.RunStatus.SUCCEEDED, second.failed
    assert second.changed == 0, "a second run must report changed=0"

    boot_id = node.host.boot_id
    node.reboot()
    assert node.host.boot_id != boot_id
    node.wait_active("capi-gpu-mig-layout.service")
    assert node.mig_devices() == Counter(LAYOUT), "the boot unit re-creates the layout"
    node.wait_active("kubelet.service")
    layout_done = node.monotonic("capi-gpu-mig-layout.service", "ActiveEnterTimestampMonotonic")
    kubelet_start = node.monotonic("kubelet.service", "ExecMainStartTimestampMonotonic")
    assert 0 < layout_done <= kubelet_start, "the layout must exist before kubelet (and the DRA plugin) starts"
    cdi = yaml.safe_load(node.sh("cat", "/etc/cdi/nvidia.yaml"))
    uuids = set(re.findall(r"UUID: (MIG-[^)]+)", node.sh("nvidia-smi", "-L")))
    assert {d["name"] for d in cdi["devices"] if d["name"].startswith("MIG-")} == uuids, "CDI regenerated at boot"

    after = await node.runner.prepare_node(node.target, site_vars(world.repo))
    assert after.status is ansible_events.RunStatus.SUCCEEDED and after.changed == 0
    print(
        f"\nsite.yml on one sim host: first run {first_s:.1f} s ({first.changed} changed), "
        f"second run {second.duration_s:.1f} s ({second.changed} changed)"
    )


async def test_mig_mode_that_needs_a_reboot_stops_the_play_and_the_rerun_completes(
    world: World, node_factory: Any
) -> None:
    node: Node = node_factory({"mig_toggle": "reboot"})
    first = await node.runner.prepare_node(node.target, site_vars(world.repo))
    assert first.status is ansible_events.RunStatus.REBOOT_NEEDED, first.failed
    assert first.reboot_reason == "mig-mode-pending" and first.failed is None
    assert node.sh("dpkg-query", "-W", "kubelet", ok=False) == "", "the play ends at the reboot request"
    assert node.mig_devices() == Counter()

    node.reboot()
    node.wait_active("capi-gpu-mig-layout.service")
    assert node.mig_devices() == Counter(LAYOUT), "mode applied at boot, layout created by the boot unit"
    second = await node.runner.prepare_node(node.target, site_vars(world.repo))
    assert second.status is ansible_events.RunStatus.SUCCEEDED, second.failed
    assert not second.reboot_needed


async def test_a_failed_task_names_its_role_and_task_a_foreign_key_is_refused_and_mig_can_be_turned_off(
    world: World, node_factory: Any
) -> None:
    node: Node = node_factory()
    impostor = ansible.SSHTarget(
        node.target.name,
        node.target.address,
        " ".join(keys.generate().public_line.split()[:2]),
        node.target.private_key,
    )
    refused = await node.runner.prepare_node(impostor, site_vars(world.repo))
    assert refused.status is ansible_events.RunStatus.HOST_KEY_MISMATCH
    assert refused.changed == 0

    # A .deb fetched by URL with the wrong pinned checksum: the play stops in its first step, before any role
    # has installed a package (the fresh image still has no driver).
    deb = world.repo.guest_deb("nvidia-mig-manager")
    sha256 = hashlib.sha256((world.repo.repo_dir / deb.removeprefix(aptrepo.GUEST_DIR + "/")).read_bytes()).hexdigest()
    by_url = {"mig_manager_deb": f"file://{deb}", "mig_manager_deb_sha256": sha256}
    tampered = site_vars(world.repo).model_copy(update={**by_url, "mig_manager_deb_sha256": "0" * 64})
    stopped = await node.runner.prepare_node(node.target, tampered)
    assert stopped.status is ansible_events.RunStatus.FAILED and stopped.failed is not None
    assert (stopped.failed.role, stopped.failed.task) == (
        "mig_layout",
        "Download nvidia-mig-manager and check its checksum",
    )
    assert node.sh("dpkg-query", "-W", "nvidia-driver-580-open", ok=False) == "", "installed before the check"

    # The shipped binary with a checksum it does not have: refused on the host after the copy, before it runs.
    forged = site_vars(world.repo).model_copy(update={"mig_parted_sha256": "1" * 64})
    refused_bin = await node.runner.prepare_node(node.target, forged)
    assert refused_bin.status is ansible_events.RunStatus.FAILED and refused_bin.failed is not None
    assert (refused_bin.failed.role, refused_bin.failed.task) == (
        "mig_layout",
        "Check the copy on the host is the binary the operator ships",
    )

    model = catalog.builtin_catalog().model("rtx-pro-6000")
    rendered = playbook_vars.MigLayoutVars.render(model, migparted.resolve(model, LAYOUT))
    wrong = rendered.model_copy(update={"expected_profiles": {"1g.24gb": 4}})
    result = await node.runner.prepare_node(node.target, site_vars(world.repo, wrong))
    assert result.status is ansible_events.RunStatus.FAILED
    assert result.failed is not None
    assert (result.failed.role, result.failed.task) == ("mig_layout", "Verify each profile's instance count")
    assert "1g.24gb: 2" in result.failed.message and "want 4" in result.failed.message

    whole_gpu = playbook_vars.MigLayoutVars.render(model, None)
    # The same .deb by URL with its right checksum is downloaded and used.
    off = await node.runner.prepare_node(node.target, site_vars(world.repo, whole_gpu).model_copy(update=by_url))
    assert off.status is ansible_events.RunStatus.SUCCEEDED, off.failed
    assert node.mig_devices() == Counter()
    mode = node.sh("nvidia-smi", "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    assert mode.strip() == "Disabled, Disabled"


def _poisoned(value: Any, payload: str) -> Any:
    """``value`` with every string leaf (keys kept) replaced by ``payload``."""
    if isinstance(value, str):
        return payload
    if isinstance(value, dict):
        return {k: _poisoned(v, payload) for k, v in value.items()}
    if isinstance(value, list):
        return [_poisoned(v, payload) for v in value]
    return value


async def test_site_yml_on_a_host_runs_no_variable_as_a_template_on_the_operator(
    world: World, node_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: every lookup runs on the operator, even in a play whose tasks run on the host. Every string
    site.yml receives, admission's patterns bypassed, carries a lookup('pipe') payload; in check mode the
    play fails on the first literal value and the operator runs nothing. The same run with the extra vars
    trusted (the tag off) writes the marker: the payload would fire if anything rendered it."""
    node: Node = node_factory()
    check = ansible.AnsibleRunner(artifacts_root=tmp_path / "check", timeout_s=600, check_mode=True)
    marker = tmp_path / "pwned"
    payload = f"{{{{ lookup('pipe', 'touch {marker}') }}}}"
    poisoned = _poisoned(site_vars(world.repo).extra_vars(), payload)
    assert payload in json.dumps(poisoned) and len(re.findall("lookup", json.dumps(poisoned))) >= 10

    result = await check.run_playbook(node.target, poisoned)
    assert not marker.exists(), "a site.yml variable ran as a template on the operator"
    assert result.status is ansible_events.RunStatus.FAILED, "a play with no valid value cannot succeed"

    monkeypatch.setattr(ansible_data, "UNSAFE_TAG", "")  # the control: as before issue 29
    await check.run_playbook(node.target, poisoned)
    assert marker.exists(), "the control run never rendered a variable: the check above proves nothing"
