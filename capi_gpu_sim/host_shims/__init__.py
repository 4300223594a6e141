"""Programs the simulator puts inside a simulated host, as {path in guest: GuestFile}.

Why as data: the same shims reach a host two ways. The simulator writes the rescue ones straight into
the rescue view (Hetzner's rescue system ships them), while the installed OS gets ``kubeadm`` the way a
real node does, from a package; ``capi_gpu_sim.aptrepo`` packages ``kubeadm_files()`` into its stand-in
``kubeadm`` .deb. Each shim is a standalone Python module of this package (standard library plus PyYAML,
which the guest tree includes), so it is type-checked and linted with the rest of the code and runs with
the guest's own python3.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources

SHEBANG = "#!/usr/bin/python3\n"


@dataclass(frozen=True)
class GuestFile:
    """A file to place in a guest tree; ``link`` makes it a symlink to that target instead."""

    content: bytes
    mode: int = 0o755
    link: str | None = None


def _script(module: str) -> bytes:
    text = resources.files(__package__).joinpath(f"{module}.py").read_text()
    return (SHEBANG + text).encode()


def _link(target: str) -> GuestFile:
    return GuestFile(b"", 0o777, link=target)


# Ahead of coreutils' /usr/bin/nproc on every PATH (sshd's, systemd's): it would count the test machine's CPUs.
NPROC = {"/usr/local/bin/nproc": _link("/usr/local/lib/sim/nproc"), "/usr/local/lib/sim/nproc": _link("hwinfo")}


def rescue_files() -> dict[str, GuestFile]:
    """What Hetzner's rescue system offers that the provider uses: installimage, hardware tools, wipefs."""
    hw = GuestFile(_script("hwinfo"))
    power = GuestFile(_script("power"))
    return {
        "/root/.oldroot/nfs/install/installimage": GuestFile(_script("installimage")),
        "/usr/local/sbin/installimage": _link("/root/.oldroot/nfs/install/installimage"),
        "/usr/local/lib/sim/hwinfo": hw,
        "/usr/bin/lsblk": _link("/usr/local/lib/sim/lsblk"),
        "/usr/local/lib/sim/lsblk": _link("hwinfo"),
        "/usr/bin/lspci": _link("/usr/local/lib/sim/lspci"),
        "/usr/local/lib/sim/lspci": _link("hwinfo"),
        "/usr/sbin/smartctl": _link("/usr/local/lib/sim/smartctl"),
        "/usr/local/lib/sim/smartctl": _link("hwinfo"),
        **NPROC,
        "/usr/local/lib/sim/wipefs": GuestFile(_script("wipefs")),
        "/usr/sbin/wipefs": _link("/usr/local/lib/sim/wipefs"),
        "/usr/local/lib/sim/power": power,
        "/usr/local/lib/sim/reboot": _link("power"),
        "/usr/local/lib/sim/poweroff": _link("power"),
        "/usr/sbin/reboot": _link("/usr/local/lib/sim/reboot"),
        "/usr/sbin/poweroff": _link("/usr/local/lib/sim/poweroff"),
        "/usr/sbin/halt": _link("/usr/local/lib/sim/poweroff"),
        "/usr/sbin/shutdown": _link("/usr/local/lib/sim/reboot"),
    }


CLOUD_INIT_UNIT = b"""[Unit]
Description=cloud-init stand-in: NoCloud seed, write_files and runcmd (simulated)
After=network.target ssh.service
ConditionPathExists=!/etc/cloud/cloud-init.disabled

[Service]
Type=oneshot
ExecStart=/usr/bin/cloud-init boot
RemainAfterExit=yes
TimeoutSec=0
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
"""


APT_GUEST_DIR = "/srv/capi-gpu-apt"  # where the fleet binds the local apt repository (capi_gpu_sim.aptrepo)
# The image's own package source: the simulated distribution archive (the aptrepo's "archive" channel). Like a
# freshly installed image, the disk carries no index for it until the first `apt-get update`.
ARCHIVE_SOURCES = f"""# The distribution archive (simulated; capi_gpu_sim.aptrepo channel "archive")
Types: deb
URIs: file:{APT_GUEST_DIR}/archive
Suites: ./
Trusted: yes
""".encode()
SOURCES_LIST = b"# The image's sources are in /etc/apt/sources.list.d/archive.sources (deb822).\n"
COLDPLUG_UNIT = b"""[Unit]
Description=Simulated kernel coldplug: nouveau or nvidia binds the GPU, as udev does at boot
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target nvidia-persistenced.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/lib/sim/kmod coldplug

[Install]
WantedBy=sysinit.target
"""


KERNEL_UPDATE_HOOK = b'DPkg::Post-Invoke { "/usr/local/lib/sim/kmod kernel-update || true"; };\n'


def kernel_files(release: str) -> dict[str, GuestFile]:
    """The kernel's side of the installed image: module state (``kmod``), ``modprobe`` and ``update-initramfs``
    ahead of kmod's on PATH, the coldplug unit, and the running kernel's (empty) module directory."""
    return {
        "/usr/local/lib/sim/kmod": GuestFile(_script("kmod")),
        "/usr/local/sbin/modprobe": _link("/usr/local/lib/sim/modprobe"),
        "/usr/local/lib/sim/modprobe": _link("kmod"),
        "/usr/local/sbin/update-initramfs": _link("/usr/local/lib/sim/update-initramfs"),
        "/usr/local/lib/sim/update-initramfs": _link("kmod"),
        "/etc/systemd/system/sim-coldplug.service": GuestFile(COLDPLUG_UNIT, 0o644),
        "/etc/systemd/system/sysinit.target.wants/sim-coldplug.service": _link(
            "/etc/systemd/system/sim-coldplug.service"
        ),
        # /usr/lib: the image is merged-/usr, and a layer directory named lib would hide the /lib symlink.
        f"/usr/lib/modules/{release}/modules.dep": GuestFile(b"", 0o644),
        # The kernel the next boot starts, as the kernel package's postinst links it.
        f"/boot/vmlinuz-{release}": GuestFile(f"stand-in kernel image {release}\n".encode(), 0o644),
        "/boot/vmlinuz": _link(f"vmlinuz-{release}"),
        # A kernel update landing mid-run (the GPU shim's kernel_update knob; nothing without it).
        "/etc/apt/apt.conf.d/99sim-kernel-update": GuestFile(KERNEL_UPDATE_HOOK, 0o644),
    }


def next_kernel(release: str) -> str:
    """The release a simulated kernel update brings: the running one with its patch level one higher."""
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)(.*)$", release)
    return f"{m.group(1)}.{m.group(2)}.{int(m.group(3)) + 1}{m.group(4)}" if m else f"{release}.sim1"


# installimage's own netplan file, as an Ubuntu image gets it (the fleet sets eth0 up before boot, and the
# stand-in only makes ``vlans:``); the private_network role's file is read after it.
NETCFG = b"""### Hetzner Online GmbH installimage (simulated)
network:
  version: 2
  renderer: networkd
  ethernets:
    eth0: {}
"""
# What netplan's generator and networkd do at a real boot: the interfaces of /etc/netplan come up again.
NETPLAN_UNIT = b"""[Unit]
Description=netplan stand-in: the VLAN interfaces of /etc/netplan at boot (simulated)
After=network.target
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/netplan apply

[Install]
WantedBy=multi-user.target
"""


def installed_files() -> dict[str, GuestFile]:
    """What every installed image brings: cloud-init (enabled at boot), lspci (pciutils), nproc, the kernel's
    module state (the guest runs the test machine's kernel, so its release), the archive as its source, and
    netplan (a stand-in that makes VLAN interfaces without 802.1Q, see ``netplan``)."""
    return {
        **kernel_files(os.uname().release),
        "/etc/apt/sources.list": GuestFile(SOURCES_LIST, 0o644),
        "/etc/apt/sources.list.d/archive.sources": GuestFile(ARCHIVE_SOURCES, 0o644),
        "/usr/bin/cloud-init": GuestFile(_script("cloudinit")),
        "/etc/systemd/system/cloud-init.service": GuestFile(CLOUD_INIT_UNIT, 0o644),
        "/etc/systemd/system/multi-user.target.wants/cloud-init.service": _link(
            "/etc/systemd/system/cloud-init.service"
        ),
        "/usr/local/lib/sim/hwinfo": GuestFile(_script("hwinfo")),
        "/usr/bin/lspci": _link("/usr/local/lib/sim/lspci"),
        "/usr/local/lib/sim/lspci": _link("hwinfo"),
        **NPROC,
        "/usr/sbin/netplan": GuestFile(_script("netplan")),
        "/etc/netplan/01-netcfg.yaml": GuestFile(NETCFG, 0o600),
        "/etc/systemd/system/netplan-sim.service": GuestFile(NETPLAN_UNIT, 0o644),
        "/etc/systemd/system/multi-user.target.wants/netplan-sim.service": _link(
            "/etc/systemd/system/netplan-sim.service"
        ),
    }


def kubeadm_files() -> dict[str, GuestFile]:
    """The stand-in ``kubeadm`` package's payload (installed by the playbooks from the local apt repo)."""
    return {"/usr/bin/kubeadm": GuestFile(_script("kubeadm"))}
