"""A cold GPU node from a baked image (issue 33), through the product's Install step on simulated GEX131s:
host A gets plain Ubuntu and the full Configure, so it is what a prepared standby is; ``capi-gpu image bake``'s
capture (``cli.image.bake_over``, over SSH pinned to A's OS key) archives A's running root less everything
that is one node's own, with its manifest, into the fleet's image directory, which the fleet's image server
serves over https to every host's rescue (``capi_gpu_sim.image_server``). Host B, in rescue, is first given
that image tampered (another sha256 than the spec's): the Install step
refuses it with ImageChecksumMismatch, permanently, and installimage never runs. Then B and C install the
real one: the archive is staged and checked in rescue, installimage writes it, each node boots once into
what it carried and Configure's package tasks change nothing (the MIG layout is there), with no further
reboot; B and C have their own machine-id, host key and hostname. B's rescue downloads the image with
curl over https, as from a user's image server; C's names it by path in rescue (the spec's other form).
Prints the bake's time and size and Configure's time and changed-task count, full install against image."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sim_helpers import BOOT_TIMEOUT_S, RobotApi, boot_rescue

from capi_gpu.api.host import (
    DiskInfo,
    ErrorType,
    HardwareDetails,
    HetznerGPUHost,
    HetznerGPUHostSpec,
    HostStandby,
    HostState,
)
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.api.specs import GPUSpec
from capi_gpu.cli.image import bake_over
from capi_gpu.controllers import host_actions
from capi_gpu.controllers.host_context import Consumer, HostEnv
from capi_gpu.gpu import catalog, migparted
from capi_gpu.provisioning import (
    ansible,
    ansible_events,
    image_bake,
    image_manifest,
    playbook_vars,
    shipped_mig_parted,
    ssh,
)
from capi_gpu.provisioning.hostkeys import HostKeyPair
from capi_gpu.provisioning.model import ActionResult, InstallProgress, Outcome
from capi_gpu_sim import aptrepo, binaries
from capi_gpu_sim.fleet import IMAGES_GUEST_DIR, Fleet, FleetConfig
from capi_gpu_sim.hosts import keys
from capi_gpu_sim.hosts.host import Host
from capi_gpu_sim.robot import RobotSim

KUBERNETES_VERSION = "v1.36.3"
LAYOUT = {"1g.24gb": 2, "2g.48gb": 1}
PACKAGE_TASK = re.compile(r"install|package|apt|dpkg|driver|\.deb", re.IGNORECASE)


@pytest.fixture
def fleet(robot: RobotSim, apt_repo: aptrepo.AptRepo, tmp_path: Path) -> Iterator[Fleet]:
    images = tmp_path / "images"
    images.mkdir()
    config = FleetConfig(hosts=3, first_server_number=2_300_001, apt_repo=apt_repo, images_dir=images)
    with Fleet(config, robot=robot) as f:
        for host in f.hosts.values():
            assert host.wait_up(BOOT_TIMEOUT_S), "the previous OS never came up"
        yield f


def site_vars(repo: aptrepo.AptRepo) -> playbook_vars.PlaybookVars:
    model = catalog.builtin_catalog().model("rtx-pro-6000")
    return playbook_vars.PlaybookVars(
        kubernetes_version=KUBERNETES_VERSION,
        mig=playbook_vars.MigLayoutVars.render(model, migparted.resolve(model, LAYOUT)),
        driver_route="nvidia-dkms",
        **aptrepo.playbook_repositories(repo),  # type: ignore[arg-type]
        **shipped_mig_parted.overrides(binaries.ensure_mig_parted()),  # type: ignore[arg-type]
    )


def env_for(name: str, client: keys.KeyPair, os_key: keys.KeyPair, image: dict[str, str] | None) -> HostEnv:
    spec = {"gpu": {"model": "rtx-pro-6000", "driverBranch": "580"}} | ({"image": image} if image else {})
    machine = HetznerGPUMachine.model_validate({"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": spec})
    consumer = Consumer(machine, name, machine.spec.install_image, machine.spec.gpu, KUBERNETES_VERSION, None, None)
    pair = HostKeyPair(os_key.private_openssh, os_key.public_line)
    return HostEnv(None, client.private_openssh, client.public_line, pair, consumer)  # type: ignore[arg-type]


def host_object(host: Host, name: str) -> HetznerGPUHost:
    obj = HetznerGPUHost(metadata={"name": name}, spec=HetznerGPUHostSpec(server_number=host.server_number))
    obj.status.hardware = HardwareDetails(disks=[DiskInfo(wwn=d.wwn, size_bytes=d.size) for d in host.hw.disks])
    return obj


def install_step(shell: ssh.ParamikoShell, host: Host, name: str, env: HostEnv) -> ActionResult:
    """The Install step's action, then installimage to its end, as the controller polls it."""
    result = host_actions._install(host_object(host, name), env, shell)
    if result.outcome is not Outcome.OK:
        return result
    deadline = time.monotonic() + 120
    while (st := shell.installimage_state()).state not in (InstallProgress.SUCCEEDED, InstallProgress.FAILED):
        assert time.monotonic() < deadline, "installimage did not finish"
        time.sleep(0.3)
    assert st.state is InstallProgress.SUCCEEDED, st.log_tail
    return result


def boot_installed(shell: ssh.ParamikoShell, host: Host) -> None:
    count = host.boot_count()
    shell.reboot()  # rescue was armed once: the next boot is the disk
    assert host.wait_up(timeout=120, after_boot=count), "the installed OS did not boot"


async def configure(
    host: Host, name: str, client: keys.KeyPair, os_key: keys.KeyPair, repo: aptrepo.AptRepo, tmp: Path
) -> tuple[ansible_events.PlaybookResult, list[ansible_events.TaskEvent], float]:
    target = ansible.SSHTarget(name, host.guest_ip, " ".join(os_key.public_line.split()[:2]), client.private_openssh)
    runner = ansible.AnsibleRunner(artifacts_root=tmp / f"artifacts-{name}", timeout_s=900)
    events: list[ansible_events.TaskEvent] = []
    started = time.monotonic()
    result = await runner.prepare_node(target, site_vars(repo), events.append)
    assert result.status is ansible_events.RunStatus.SUCCEEDED, result.failed
    return result, events, time.monotonic() - started


def standby_record(host: Host, name: str, os_key: keys.KeyPair) -> HetznerGPUHost:
    """Host A as the controller records a prepared standby (what ``capi-gpu image bake`` reads)."""
    obj = host_object(host, name)
    obj.spec.standby = HostStandby(
        gpu=GPUSpec(model="rtx-pro-6000", driver_branch="580"), kubernetes_version=KUBERNETES_VERSION
    )
    obj.status.state, obj.status.prepared, obj.status.ipv4 = HostState.STANDBY, "e2e/e2e", host.guest_ip
    obj.status.host_keys.os = os_key.public_line
    return obj


def os_shell(host: Host, client: keys.KeyPair, os_key: keys.KeyPair) -> ssh.ParamikoShell:
    endpoint = ssh.Endpoint(host.guest_ip, ssh.HostKeyPin.from_public_key(os_key.public_line))
    return ssh.ParamikoShell(endpoint, ssh.Credentials(private_key=client.private_openssh))


def identity(host: Host) -> tuple[str, str, str]:
    """machine-id, the SSH host key sshd serves, hostname."""
    out = host.exec(["sh", "-c", "cat /etc/machine-id; cat /etc/ssh/ssh_host_ed25519_key.pub; hostname"])
    machine_id, key, name = out.stdout.decode().splitlines()[:3]
    return machine_id.strip(), " ".join(key.split()[:2]), name.strip()


def install_from(
    host: Host, name: str, robot_api: RobotApi, client: keys.KeyPair, image: dict[str, str]
) -> keys.KeyPair:
    """Rescue, the Install step from ``image``, one boot into it; the node's pinned OS key."""
    os_key = keys.generate()
    with boot_rescue(host, robot_api, client).shell(client) as shell:
        result = install_step(shell, host, name, env_for(name, client, os_key, image))
        assert "installing from the node image" in result.message
        assert "IMAGE /root/capi-gpu-image/capi-gpu-node-amd64-image.tar.gz" in (shell.read_file("/autosetup") or "")
        boot_installed(shell, host)
    assert [r["event"] for r in host.installimage_runs()] == ["start", "end"]
    assert json.loads((host.disk_dir / "installed.json").read_text())["node_image"] is True
    return os_key


async def test_a_node_installed_from_a_baked_image_needs_no_package_changes(
    fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair, apt_repo: aptrepo.AptRepo, tmp_path: Path
) -> None:
    a, b, c = fleet.hosts.values()
    images = fleet.config.images_dir
    assert images is not None

    # Host A: plain Ubuntu and the full node install, as the standby pool prepares a host.
    a_key = keys.generate()
    with boot_rescue(a, robot_api, client_key).shell(client_key) as shell:
        plain = install_step(shell, a, "gex131-a", env_for("gex131-a", client_key, a_key, None))
        assert plain.message == "installimage started"
        boot_installed(shell, a)
    full, full_events, full_s = await configure(a, "gex131-a", client_key, a_key, apt_repo, tmp_path)
    a_identity = identity(a)

    # The product's bake of A's running root.
    archive = images / "gex131-rtx-pro-6000-580-amd64.tar.gz"
    with os_shell(a, client_key, a_key) as shell:
        baked = bake_over(shell, standby_record(a, "gex131-a", a_key), archive, catalog.builtin_catalog())
        assert shell.read_file(image_bake.BAKE_DIR) is None, "the bake left its work dir on the host"
    sha, size = baked.sha256, archive.stat().st_size
    assert sha == hashlib.sha256(archive.read_bytes()).hexdigest() and size == baked.size
    manifest = image_manifest.parse(baked.manifest)
    assert (manifest.gpu_model, manifest.kubernetes_version, manifest.source.name) == (
        "rtx-pro-6000",
        KUBERNETES_VERSION,
        "gex131-a",
    )
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert names[0] == f"./{image_manifest.MANIFEST_PATH}", names[:3]
        assert tar.extractfile(names[0]).read().decode() == baked.manifest  # type: ignore[union-attr]
        machine_id = tar.getmember("./etc/machine-id")
        assert machine_id.size == 0 and names.count("./etc/machine-id") == 1
    # What the bake removed, listed: none of the source's identity or node state is in the image.
    leaked = [n for n in names if re.match(
        r"^\./(etc/ssh/ssh_host_|root/\.ssh/.|var/lib/cloud/.|var/lib/kubelet/.|etc/kubernetes/.|var/log/.|"
        r"etc/netplan/.|var/tmp/.|tmp/.|installimage\.|etc/hostname$|etc/hosts$|var/lib/containerd/.)", n
    )]  # fmt: skip
    assert leaked == [], leaked[:20]
    present = [p for p, _ in image_bake.EXCLUDED if a.exec(["sh", "-c", f"ls -d /{p[2:]} 2>/dev/null"]).stdout]
    print(f"\nthe bake left out, of what A holds: {present}")
    assert {"./etc/machine-id", "./etc/ssh/ssh_host_*", "./root/.ssh", "./var/lib/cloud", "./var/log/*"} <= set(present)

    # Host B, tampered first: the same archive with one byte more, against the real sha256.
    tampered = images / "tampered-amd64.tar.gz"
    tampered.write_bytes(archive.read_bytes() + b"\0")
    rescue = boot_rescue(b, robot_api, client_key)
    with rescue.shell(client_key) as shell:
        refused = host_actions._install(
            host_object(b, "gex131-b"),
            env_for("gex131-b", client_key, keys.generate(), {"url": fleet.image_url(tampered.name), "sha256": sha}),
            shell,
        )
        assert (refused.outcome, refused.error_type, refused.permanent) == (
            Outcome.FAILED,
            ErrorType.IMAGE_CHECKSUM_MISMATCH,
            True,
        ), refused
        assert sha in refused.message and "nothing was written" in refused.message
        assert b.installimage_runs() == [], "installimage ran on a tampered image"
        assert shell.installimage_state().state is InstallProgress.NOT_STARTED
    tampered.unlink()

    # B and C from the real image (B's rescue boots again: the spec was fixed). B's rescue downloads it over
    # https from the fleet's image server, as from a user's; C's names it by path in rescue, the other form.
    started = time.monotonic()
    b_key = install_from(b, "gex131-b", robot_api, client_key, {"url": fleet.image_url(archive.name), "sha256": sha})
    install_s = time.monotonic() - started
    c_key = install_from(
        c, "gex131-c", robot_api, client_key, {"url": f"{IMAGES_GUEST_DIR}/{archive.name}", "sha256": sha}
    )
    boots = {h.name: h.boot_count() for h in (b, c)}
    for h in (b, c):  # it booted what the image carried, before any Configure
        assert h.exec(["cat", f"/{image_manifest.MANIFEST_PATH}"]).stdout.decode() == baked.manifest
        assert h.exec(["dpkg-query", "-W", "-f=${Version}", "kubelet"]).stdout.decode() == "1.36.3-1.1"

    (again, image_events, image_s), (again_c, _, _) = await asyncio.gather(
        configure(b, "gex131-b", client_key, b_key, apt_repo, tmp_path),
        configure(c, "gex131-c", client_key, c_key, apt_repo, tmp_path),
    )
    changed = [e.label for e in image_events if e.phase is ansible_events.TaskPhase.CHANGED]
    package_changes = [label for label in changed if PACKAGE_TASK.search(label)]
    full_changed = [e.label for e in full_events if e.phase is ansible_events.TaskPhase.CHANGED]
    print(
        f"\nnode image: bake {baked.seconds:.1f} s ({size / 2**20:.0f} MiB), stage+check+installimage "
        f"{install_s:.1f} s\nConfigure after the full install: {full_s:.1f} s, {full.changed} changed "
        f"({sum(1 for x in full_changed if PACKAGE_TASK.search(x))} package tasks)\n"
        f"Configure on the node from the image: {image_s:.1f} s, {again.changed} changed: {changed}"
    )
    assert package_changes == [], package_changes
    assert again.changed < full.changed and again_c.changed == again.changed
    for h in (b, c):
        assert h.boot_count() == boots[h.name], f"{h.name} rebooted during Configure: more than one reboot"
        mig = h.exec(["nvidia-smi", "-L"]).stdout.decode()
        assert Counter(re.findall(r"MIG\s+(\S+)\s+Device", mig)) == Counter(LAYOUT), mig

    # Each node its own: machine-id (made at first boot from the image's empty one), host key, hostname.
    ids = {"gex131-a": a_identity, "gex131-b": identity(b), "gex131-c": identity(c)}
    for name, (machine_id, _key, hostname) in ids.items():
        assert re.fullmatch(r"[0-9a-f]{32}", machine_id), (name, machine_id)
        assert hostname == name
    assert ids["gex131-b"][1] == " ".join(b_key.public_line.split()[:2])
    assert ids["gex131-c"][1] == " ".join(c_key.public_line.split()[:2])
    for field in (0, 1):
        assert len({v[field] for v in ids.values()}) == 3, ids
