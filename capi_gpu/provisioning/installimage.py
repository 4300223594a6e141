"""What installimage is given: the ``/autosetup`` config and the post-install script. Pure text rendering.

Disks are named by WWN (``/dev/disk/by-id``) because NVMe names can change between rescue and the OS.
The post-install script runs chrooted in the new system: it installs the OS host key the controller
generated (so the first SSH into the OS is already pinned), authorizes the controller's key, writes the
NoCloud seed, and keeps cloud-init from running at boot: the bootstrap (kubeadm join) must wait until
Ansible has installed the driver and applied the MIG layout, so the controller starts it explicitly.
It carries secrets (the OS host private key, the bootstrap data): it travels over SFTP, never on a
command line, and is never logged.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Sequence

import yaml

from capi_gpu.api.host import DiskInfo, RootDeviceHints
from capi_gpu.api.specs import InstallImageSpec

MARKER = "CAPI_GPU_POST_INSTALL_DONE"
SEED_DIR = "/var/lib/cloud/seed/nocloud-net"
CLOUD_INIT_DISABLED = "/etc/cloud/cloud-init.disabled"
ESP_MOUNT = "/boot/efi"
ESP_PART = f"PART {ESP_MOUNT} esp 256M"


class NoInstallDisk(ValueError):
    """The host has no disk the spec allows installing on."""


def disk_path(wwn: str) -> str:
    if wwn.startswith(("eui.", "nvme-")):
        return f"/dev/disk/by-id/{wwn if wwn.startswith('nvme-') else 'nvme-' + wwn}"
    return f"/dev/disk/by-id/wwn-{wwn}"


def root_disks(disks: Sequence[DiskInfo], hints: RootDeviceHints | None, spec: InstallImageSpec) -> list[str]:
    """WWNs to install on: the hints when given, else every non-rotational disk (RAID) or the first one."""
    known = [d.wwn for d in disks if d.wwn]
    if hints and hints.raid_wwns:
        chosen = list(hints.raid_wwns)
    elif hints and hints.wwn:
        chosen = [hints.wwn]
    else:
        ssd = [d.wwn for d in sorted(disks, key=lambda d: d.wwn) if d.wwn and not d.rotational]
        chosen = ssd if spec.swraid else ssd[:1]
    missing = [w for w in chosen if w not in known]
    if missing or not chosen:
        raise NoInstallDisk(f"root device hints {missing or chosen} are not disks of this host (have {known})")
    if spec.swraid and len(chosen) < 2:
        raise NoInstallDisk(f"swraid needs at least two disks, have {chosen}")
    return chosen


def autosetup(spec: InstallImageSpec, hostname: str, wwns: Sequence[str], uefi: bool = False) -> str:
    """The config; on a UEFI-booted rescue system it starts with the EFI System Partition installimage
    demands there (hetzneronline/installimage functions.sh: exactly one ``esp`` at /boot/efi, >= 256M;
    installimage's own defaults put it first), unless the spec already mounts something at /boot/efi."""
    lines = [f"DRIVE{i} {disk_path(w)}" for i, w in enumerate(wwns, start=1)]
    lines += [f"SWRAID {spec.swraid}", f"SWRAIDLEVEL {spec.swraid_level}", "BOOTLOADER grub", f"HOSTNAME {hostname}"]
    if uefi and not any(p.mount == ESP_MOUNT for p in spec.partitions):
        lines.append(ESP_PART)
    lines += [f"PART {p.mount} {p.file_system.value} {p.size}" for p in spec.partitions]
    lines.append(f"IMAGE {spec.image_path}")
    return "\n".join(lines) + "\n"


def meta_data(instance_id: str, hostname: str, server_number: int | None = None) -> str:
    """The NoCloud meta-data, dumped as YAML data (never formatted text): a value with a newline or ``: ``
    stays one value, so no name or uid can add a key cloud-init would act on."""
    meta: dict[str, str | int] = {"instance-id": instance_id, "local-hostname": hostname}
    if server_number is not None:
        meta["server_number"] = server_number
    return yaml.safe_dump(meta, sort_keys=False, default_flow_style=False)


def _heredoc(path: str, content: str, mode: str) -> str:
    data = base64.b64encode(content.encode()).decode()
    return (
        f"install -d -m 0755 {shlex.quote(path.rsplit('/', 1)[0])}\n"
        f"echo {data} | base64 -d > {shlex.quote(path)}\nchmod {mode} {shlex.quote(path)}\n"
    )


def post_install(
    hostname: str,
    os_host_private_key: str,
    os_host_public_key: str,
    authorized_key: str,
    instance_id: str,
    user_data: str | None,
    extra: str | None = None,
    server_number: int | None = None,
) -> str:
    """The ``-x`` script. ``user_data`` is the bootstrap data, or None for a standby install."""
    key_type = os_host_public_key.split(maxsplit=1)[0].removeprefix("ssh-")
    meta = meta_data(instance_id, hostname, server_number)
    parts = [
        "#!/bin/bash\nset -euo pipefail\numask 077\n",
        "rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub\n",
        _heredoc(f"/etc/ssh/ssh_host_{key_type}_key", os_host_private_key.rstrip("\n") + "\n", "0600"),
        _heredoc(f"/etc/ssh/ssh_host_{key_type}_key.pub", os_host_public_key + "\n", "0644"),
        _heredoc("/root/.ssh/authorized_keys", authorized_key.strip() + "\n", "0600"),
        _heredoc(f"{SEED_DIR}/meta-data", meta, "0600"),
        _heredoc(f"{SEED_DIR}/user-data", user_data or "#cloud-config\n{}\n", "0600"),
        f"install -d /etc/cloud && touch {CLOUD_INIT_DISABLED}\n",
    ]
    if extra:
        parts.append(extra.rstrip() + "\n")
    parts.append(f"echo {MARKER}\n")
    return "".join(parts)
