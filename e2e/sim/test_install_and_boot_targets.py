"""installimage in the simulated rescue system and the boot targets around it: malformed /autosetup is
rejected with installimage's messages, a good one plus post-install boots an OS with the pinned key and
the NoCloud seed, the local apt repository is bound read-only into every disk boot (previous OS, and the
installed one after installimage reset the disk), resets switch rescue/OS (hostname, boot id), a reboot
from inside the OS boots what Robot has armed (rescue once, then the disk), installimage survives a
dropped session, a UEFI-booted rescue system (hardware knob) shows /sys/firmware/efi and installimage
there demands the ESP the provider's config adds, and rescue inspection (disks by WWN, SMART, lspci GPU, other-Linux) reflects the
hardware knobs; wipefs clears another OS's disk (other-Linux finds nothing, nothing boots); rescue and
installed OS report the GEX131's CPU threads and memory, and systemd still boots cleanly under the bound
/proc files."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest
from sim_helpers import BOOT_TIMEOUT_S, Rescue, RobotApi, boot_rescue

from capi_gpu.api.specs import InstallImageSpec
from capi_gpu.provisioning import hostfacts, ssh, sshtransport
from capi_gpu.provisioning import installimage as provider_installimage
from capi_gpu.provisioning.model import CloudInitState, InstallProgress
from capi_gpu_sim import aptrepo
from capi_gpu_sim.fleet import Fleet
from capi_gpu_sim.hosts import keys, views
from capi_gpu_sim.hosts.host import Host, Running, State

IMAGE = "/root/.oldroot/nfs/images/Ubuntu-2404-noble-amd64-base.tar.gz"
GEX131_CPU_MEMORY = (48, 257_672)  # nproc; MemTotal of 256 GB installed, in MiB (not the test machine's)


def autosetup(drive1: str, drive2: str | None = None, hostname: str = "bm-gpu-1", extra: str = "") -> str:
    lines = [f"DRIVE1 {drive1}"]
    if drive2:
        lines += [f"DRIVE2 {drive2}", "SWRAID 1", "SWRAIDLEVEL 1"]
    else:
        lines += ["SWRAID 0"]
    lines += ["BOOTLOADER grub", f"HOSTNAME {hostname}", "PART /boot ext4 1024M", "PART / ext4 all", f"IMAGE {IMAGE}"]
    return "\n".join(lines) + "\n" + extra


def post_install(os_key: keys.KeyPair, hostname: str, user_data: str) -> str:
    """What the controller's post-install does (CAPH §1.6): OS host key, NoCloud seed, marker."""
    return f"""#!/bin/bash
set -euo pipefail
rm -f /etc/ssh/ssh_host_*
cat > /etc/ssh/ssh_host_ed25519_key <<'EOK'
{os_key.private_openssh.strip()}
EOK
chmod 600 /etc/ssh/ssh_host_ed25519_key
echo '{os_key.public_line}' > /etc/ssh/ssh_host_ed25519_key.pub
mkdir -p /var/lib/cloud/seed/nocloud-net
printf 'instance-id: {hostname}\\nlocal-hostname: {hostname}\\n' > /var/lib/cloud/seed/nocloud-net/meta-data
cat > /var/lib/cloud/seed/nocloud-net/user-data <<'EOUD'
{user_data}
EOUD
echo POST_INSTALL_SCRIPT_FINISHED
"""


def wait_install(shell: ssh.ParamikoShell, timeout: float = 60) -> ssh.InstallImageStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = shell.installimage_state()
        if st.state in (InstallProgress.SUCCEEDED, InstallProgress.FAILED):
            return st
        time.sleep(0.2)
    raise AssertionError("installimage did not finish")


def assert_apt_repo_bound(host: Host) -> None:
    """The fleet's apt repository at its guest path, read-only, and not a copy on the host's disk."""
    listing = host.exec(["cat", f"{aptrepo.GUEST_DIR}/kubernetes/Packages"])
    assert listing.returncode == 0 and b"Package: kubeadm" in listing.stdout, listing.stderr
    write = host.exec(["touch", f"{aptrepo.GUEST_DIR}/x"])
    assert write.returncode != 0 and b"Read-only file system" in write.stderr
    assert not (host.disk_dir / "upper" / aptrepo.GUEST_DIR.lstrip("/")).exists()


BAD = [
    ("DRIVE1 /dev/sda\nHOSTNAME x\nPART / ext4 all\nIMAGE " + IMAGE + "\n", "ERROR: Value for DRIVE1 is not correct"),
    (
        autosetup("/dev/nvme0n1")
        .replace("PART /boot ext4 1024M\n", "PART / ext4 all\n", 1)
        .replace("PART / ext4 all\nPART / ext4 all", "PART / ext4 all\nPART /home ext4 all"),
        'ERROR: Partition size "all" has to be on the last partition',
    ),
    (
        autosetup("/dev/nvme0n1").replace(IMAGE, "/root/.oldroot/nfs/images/Ubuntu-2404-noble-amd64-base.img"),
        "is no valid FILETYPE for images",
    ),
    (autosetup("/dev/nvme0n1").replace("HOSTNAME bm-gpu-1", "HOSTNAME "), "ERROR: HOSTNAME may not be empty"),
    (
        autosetup("/dev/nvme0n1").replace("SWRAID 0", "SWRAID 1\nSWRAIDLEVEL 1"),
        "ERROR: You need to select at least 2 disks for creating software raid!",
    ),
    (
        autosetup("/dev/nvme0n1").replace("PART /boot ext4 1024M", "PART /boot ext9 1024M"),
        "ERROR: Filesystem for partition 1 is not correct",
    ),
    (
        autosetup("/dev/nvme0n1").replace("PART /boot ext4 1024M", "PART /boot ext4 100M"),
        "ERROR: Your /boot partition has to be at least 200M",
    ),
]


def test_malformed_autosetup_fails_with_installimage_messages(rescue: Rescue, client_key: keys.KeyPair) -> None:
    with rescue.shell(client_key) as shell:
        assert not shell.uefi()  # the knob's default: BIOS, whatever the test machine booted with
        for config, message in BAD:
            shell.start_installimage(config)
            st = wait_install(shell)
            assert st.state is InstallProgress.FAILED, config
            assert st.exit_status == 1
            assert message in st.log_tail, (message, st.log_tail)
    # A refused config installs nothing: the disk still holds the previous OS it came with.
    record = views.installed(rescue.host.disk_dir)
    assert record is not None and record.get("previous") is True, record


def test_install_reboot_and_resets_switch_boot_targets(
    fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair
) -> None:
    host = fleet.host()
    rescue = boot_rescue(host, robot_api, client_key)
    os_key = keys.generate(comment="root@bm-gpu-1")
    user_data = (
        "#cloud-config\nwrite_files:\n- path: /root/hello\n  content: aGVsbG8K\n  encoding: b64\n"
        "runcmd:\n- [sh, -c, 'echo ran > /root/runcmd.out']\n"
    )
    with rescue.shell(client_key) as shell:
        rescue_boot_id = shell.boot_id()
        wwns = [d.wwn for d in shell.disks() if d.wwn]
        shell.start_installimage(
            autosetup(f"/dev/disk/by-id/nvme-{wwns[0]}", f"/dev/disk/by-id/nvme-{wwns[1]}"),
            post_install(os_key, "bm-gpu-1", user_data),
        )
        st = wait_install(shell)
        assert st.state is InstallProgress.SUCCEEDED, st.log_tail
        assert "POST_INSTALL_SCRIPT_FINISHED" in st.log_tail
        before = host.boot_count()
        shell.reboot()
    assert host.wait_up(BOOT_TIMEOUT_S, after_boot=before)
    assert host.running is Running.INSTALLED
    os_pin = ssh.HostKeyPin.from_public_key(os_key.public_line)
    with ssh.ParamikoShell(
        ssh.Endpoint(host.guest_ip, os_pin), ssh.Credentials(private_key=client_key.private_openssh)
    ) as osh:
        assert osh.hostname() == "bm-gpu-1"
        assert osh.boot_id() != rescue_boot_id
        deadline = time.monotonic() + 30
        while osh.cloud_init_status() is not CloudInitState.DONE and time.monotonic() < deadline:
            time.sleep(0.2)
        assert osh.cloud_init_status() is CloudInitState.DONE
        assert osh.cpu_memory() == GEX131_CPU_MEMORY
    state = host.exec(["systemctl", "is-system-running", "--wait"], timeout=60)
    assert state.stdout.strip() == b"running", host.exec(["systemctl", "--failed"]).stdout  # /proc binds are fine
    assert host.read_file("/root/hello") == b"hello\n"
    assert host.read_file("/root/runcmd.out") == b"ran\n"
    assert b"local-hostname: bm-gpu-1" in (host.read_file("/var/lib/cloud/seed/nocloud-net/meta-data") or b"")
    assert host.read_file("/installimage.conf") is not None
    assert_apt_repo_bound(host)  # the install reset the disk; the repository is a mount of every boot
    with pytest.raises(ssh.HostKeyMismatch):
        rescue.shell(client_key).hostname()  # the rescue pin on the installed OS
    again = boot_rescue(host, robot_api, client_key)
    with again.shell(client_key) as shell:
        assert shell.hostname() == "rescue"
    before = host.boot_count()
    robot_api.reset(host.server_number, "hw")  # no rescue armed: the disk boots
    assert host.wait_up(BOOT_TIMEOUT_S, after_boot=before)
    with ssh.ParamikoShell(
        ssh.Endpoint(host.guest_ip, os_pin), ssh.Credentials(private_key=client_key.private_openssh)
    ) as osh:
        assert osh.hostname() == "bm-gpu-1"


def test_a_reboot_from_inside_the_os_boots_what_robot_has_armed(
    fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair
) -> None:
    host = fleet.host()
    assert host.running is Running.PREVIOUS
    assert_apt_repo_bound(host)
    activation = robot_api.activate_rescue(host.server_number, [robot_api.add_key("e2e", client_key.public_line)])
    before = host.boot_count()
    host.exec(["systemctl", "reboot"])  # no Robot reset: the fleet asks Robot what boots now
    assert host.wait_up(BOOT_TIMEOUT_S, after_boot=before)
    assert host.running is Running.RESCUE
    rescue = Rescue(host, ssh.HostKeyPin.from_robot(activation["host_key"]), str(activation["password"]), activation)
    with rescue.shell(client_key) as shell:
        assert shell.hostname() == "rescue"
        before = host.boot_count()
        shell.reboot()  # the activation was consumed: the disk boots
    assert host.wait_up(BOOT_TIMEOUT_S, after_boot=before)
    assert host.running is Running.PREVIOUS


def test_installimage_survives_a_dropped_session(fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair) -> None:
    host = fleet.host()
    host.set_hardware(dataclasses.replace(host.hw, installimage_seconds=3.0))
    rescue = boot_rescue(host, robot_api, client_key)
    shell = rescue.shell(client_key)
    shell.start_installimage(autosetup("/dev/nvme0n1"))
    assert shell.installimage_state().state is InstallProgress.RUNNING
    session = sshtransport.Session(
        ssh.Endpoint(host.guest_ip, rescue.pin), ssh.Credentials(private_key=client_key.private_openssh)
    )
    killer = threading.Timer(0.5, host.drop_ssh)
    killer.start()
    with pytest.raises(ssh.SessionDropped):
        session.run("sleep", "sleep 10", timeout=20)
    killer.join()
    assert shell.hostname() == "rescue"  # the next operation opens a new session
    with rescue.shell(client_key) as again:
        assert again.installimage_state().state is InstallProgress.RUNNING
        assert wait_install(again).state is InstallProgress.SUCCEEDED


def test_a_uefi_rescue_shows_efi_and_installimage_demands_an_esp(
    fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair
) -> None:
    """The firmware knob: /sys/firmware/efi only in a UEFI-booted rescue system (never the test machine's);
    installimage then refuses the BIOS-era config, and takes the provider's one with the ESP."""
    host = fleet.host()
    host.set_hardware(dataclasses.replace(host.hw, uefi=True, installimage_seconds=0.1))
    rescue = boot_rescue(host, robot_api, client_key)
    with rescue.shell(client_key) as shell:
        assert shell.uefi()
        wwns = [d.wwn or "" for d in shell.disks()]
        shell.start_installimage(autosetup(f"/dev/disk/by-id/nvme-{wwns[0]}"))
        st = wait_install(shell)
        assert st.state is InstallProgress.FAILED and "ERROR: ESP missing or multiple ESP found" in st.log_tail
        shell.start_installimage(provider_installimage.autosetup(InstallImageSpec(), "bm-gpu-1", wwns, uefi=True))
        st = wait_install(shell)
        assert st.state is InstallProgress.SUCCEEDED, st.log_tail
    table = json.loads((host.disk_dir / "partitions.json").read_text())
    assert [[r["mount"] for r in table[d]] for d in ("nvme0n1", "nvme1n1")] == [["/boot/efi", "/boot", "/"]] * 2


def test_a_session_killed_unnoticed_reconnects_once(rescue: Rescue, client_key: keys.KeyPair) -> None:
    """CI once saw the race: sshd was killed, the client's reader thread had not seen the reset yet, and the
    next command failed on the stale transport. Pinned here by keeping the dead transport 'active'."""
    session = sshtransport.Session(
        ssh.Endpoint(rescue.host.guest_ip, rescue.pin), ssh.Credentials(private_key=client_key.private_openssh)
    )
    try:
        assert session.run("hostname", "hostname").text.strip() == "rescue"
        stale = session._transport
        assert stale is not None
        stale.is_active = lambda: True  # type: ignore[method-assign]
        assert rescue.host.drop_ssh() >= 1
        deadline = time.monotonic() + 10
        while stale.active and time.monotonic() < deadline:  # the reader thread has now seen the reset
            time.sleep(0.05)
        assert not stale.active
        assert session.run("hostname", "hostname").text.strip() == "rescue"
        assert session._transport is not stale
    finally:
        session.close()


def test_rescue_inspection_follows_the_hardware_knobs(rescue: Rescue, client_key: keys.KeyPair) -> None:
    host = rescue.host
    with rescue.shell(client_key) as shell:
        assert shell.cpu_memory() == GEX131_CPU_MEMORY
        disks = shell.disks()
        assert [d.name for d in disks] == ["nvme0n1", "nvme1n1"]
        assert all(d.size_bytes == 960_197_124_096 and d.wwn and d.wwn.startswith("eui.") for d in disks)
        assert not any(d.rotational for d in disks)
        assert shell.smart_ok()
        host.set_smart("nvme1n1", healthy=False)
        assert shell.smart_ok([disks[0].wwn or ""])
        assert not shell.smart_ok()
        gpus = shell.gpus()
        assert [(g.vendor_id, g.device_id, hostfacts.fell_off_bus(g)) for g in gpus] == [(0x10DE, 0x2BB5, False)]
        host.gpu_fall_off_bus(until_reboot=False)
        assert hostfacts.fell_off_bus(shell.gpus()[0])
        # the previous OS lives on nvme0n1: installing on nvme1n1 alone would leave it bootable
        assert shell.other_linux_present([disks[1].wwn or ""])
        assert shell.other_linux_present([disks[0].wwn or ""]) == []
        with pytest.raises(ssh.UnknownDisk):
            shell.other_linux_present(["eui.0000"])


def test_wipe_clears_another_os_so_it_neither_shows_nor_boots(
    rescue: Rescue, robot_api: RobotApi, client_key: keys.KeyPair
) -> None:
    host = rescue.host
    with rescue.shell(client_key) as shell:
        first, second = (d.wwn or "" for d in shell.disks())
        assert shell.other_linux_present([second]), "the previous OS is on the first disk"
        shell.wipe([first])  # wipefs -a /dev/nvme0n1, as the controller's Wipe step
        assert shell.other_linux_present([second]) == []
        assert [len(d.partitions) for d in shell.disks()] == [0, 0]
    before = host.boot_count()
    robot_api.reset(host.server_number, "hw")  # no rescue armed: the disk would boot, but it is blank now
    assert host.wait_state(State.OFF, BOOT_TIMEOUT_S)
    assert host.boot_count() == before
