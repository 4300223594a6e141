"""The stand-in packages of the simulation's local apt repository, with the names the real repos use.

Why the real names: ``playbooks/site.yml`` is production code and must run unchanged against a
simulated host; only the repository variables differ. So each package here is called what NVIDIA's
CUDA repository, NVIDIA's container-toolkit repository, Docker's repository and pkgs.k8s.io call it,
carries the files the playbook relies on (binaries, systemd units, the conffile it overwrites), and
depends on its siblings and on the distribution archive the way the real ones do (dkms, X libraries,
conntrack: the ``archive`` channel, which a fresh image has no index for). Maintainer scripts only where the
playbook depends on what the real one does: the DKMS build (a module only for kernels whose headers are
installed, also when headers arrive later); other postinsts enable units, which the playbook does itself.
The kernel side (modprobe, coldplug, initramfs) is ``capi_gpu_sim.host_shims.kmod``.

The programs are: the GPU shim (``capi_gpu_sim.gpu_shim``: nvidia-smi, nvidia-mig-parted, and
nvidia-ctk if it has one), the kubeadm shim (``capi_gpu_sim.host_shims``), and the small stand-ins of
this package (containerd that validates its config, idle daemons, a fallback nvidia-ctk).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable

from capi_gpu_sim import host_shims

SHEBANG = b"#!/usr/bin/python3\n"
GPU_SHIM_PACKAGE = "capi_gpu_sim.gpu_shim"

# Channel -> which real repository it stands in for; ARCHIVE is the distribution's own archive, the
# installed image's only configured source (capi_gpu_sim.host_shims.ARCHIVE_SOURCES), with no index on disk.
NVIDIA, TOOLKIT, DOCKER, KUBERNETES = "nvidia", "nvidia-container-toolkit", "docker", "kubernetes"
ARCHIVE = "archive"
CHANNELS = (NVIDIA, TOOLKIT, DOCKER, KUBERNETES, ARCHIVE)
# The Origin and Label each channel's Release carries, where apt pins by them: NVIDIA's CUDA repository's (its
# cuda-<distro>.pin matches l=NVIDIA CUDA) and the distribution archive's, as apt sees Debian's on the simulated
# hosts (debootstrapped bookworm, whose facts say Debian). The others keep the simulation's.
RELEASE_ORIGINS = {NVIDIA: ("NVIDIA", "NVIDIA CUDA"), ARCHIVE: ("Debian", "Debian")}

# The 575 version is the GPU shim's default; the packaged shim reports the version of its package.
DRIVER_VERSIONS = {"575": "575.57.08", "580": "580.95.05"}
MIG_MANAGER_VERSION = "0.15.0"
# Where the simulated driver's user space puts the GPU shim's nvidia-mig-parted. The node install copies the
# real, shipped nvidia-mig-parted to the host, checks its checksum and runs its --version there; applying a
# layout needs NVML, which a simulated host has not, so the role runs this one instead (the test-only
# PlaybookVars.mig_parted_exec, set by capi_gpu_sim.aptrepo.playbook_repositories).
SIM_MIG_PARTED = "/usr/lib/capi-gpu-sim/nvidia-mig-parted"
TOOLKIT_VERSION = "1.18.0"
CONTAINERD_VERSION = "2.1.5"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    channel: str
    description: str
    files: dict[str, host_shims.GuestFile] = field(default_factory=dict)
    depends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    postinst: str = ""
    """A maintainer script (sh), for the few packages whose real postinst the playbook depends on."""

    @property
    def deb_name(self) -> str:
        return f"{self.name}_{self.version}_all.deb"


def _read(pkg: str, module: str) -> bytes:
    node: Traversable = resources.files(pkg).joinpath(f"{module}.py")
    if not node.is_file():
        raise FileNotFoundError(f"{pkg}/{module}.py is missing: the stand-in repository needs it")
    return node.read_bytes()


def _script(module: str, **subst: str) -> host_shims.GuestFile:
    text = _read(__package__, module)
    for key, value in subst.items():
        text = text.replace(f"@{key}@".encode(), value.encode())
    return host_shims.GuestFile(SHEBANG + text)


def _gpu_shim(module: str) -> host_shims.GuestFile:
    text = _read(GPU_SHIM_PACKAGE, module)
    return host_shims.GuestFile(text if text.startswith(b"#!") else SHEBANG + text)


def _nvidia_smi(driver_version: str) -> host_shims.GuestFile:
    """The shim, reporting the driver version of the package that installs it (as a real nvidia-smi does)."""
    shim = _gpu_shim("nvidia_smi")
    text, n = re.subn(rb'"driver_version": "[0-9.]+"', f'"driver_version": "{driver_version}"'.encode(), shim.content)
    if n != 1:
        raise ValueError("nvidia_smi shim: expected one DEFAULTS driver_version to set")
    return host_shims.GuestFile(text, shim.mode)


def _unit(text: str) -> host_shims.GuestFile:
    return host_shims.GuestFile(text.encode(), 0o644)


def _doc(name: str) -> dict[str, host_shims.GuestFile]:
    return {f"/usr/share/doc/{name}/README.capi-gpu-sim": _unit(f"{name}: stand-in of the capi-gpu simulation\n")}


def _nvidia_ctk() -> host_shims.GuestFile:
    try:
        return _gpu_shim("nvidia_ctk")
    except FileNotFoundError:
        return _script("nvidia_ctk", VERSION=TOOLKIT_VERSION)


def _kubeadm() -> dict[str, host_shims.GuestFile]:
    try:
        return host_shims.kubeadm_files()
    except (FileNotFoundError, AttributeError):
        return {"/usr/bin/kubeadm": host_shims.GuestFile(b"#!/bin/sh\necho 'kubeadm: placeholder' >&2\nexit 1\n")}


PERSISTENCED_PID = "/run/nvidia-persistenced/nvidia-persistenced.pid"  # the GPU shim checks it
# Ubuntu's unit (nvidia-compute-utils-<branch>): forking, and persistence mode off unless overridden.
PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (capi-gpu simulation)
Wants=syslog.target

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""
# DKMS as dh_dkms's postinst and dkms's kernel hooks use it: build for every installed kernel whose headers
# are installed (/lib/modules/<k>/build), skip the others with dkms's own message. "Building" writes the
# module files the kernel stand-in (capi_gpu_sim.host_shims.kmod) loads.
DKMS_BUILD = """#!/bin/sh
# dkms autoinstall for one kernel (capi-gpu simulation)
k="$1"
for conf in /usr/src/*/dkms.conf; do
  [ -e "$conf" ] || continue
  if [ ! -e "/lib/modules/$k/build" ]; then
    echo "Module build for kernel $k was skipped since the kernel headers for this kernel do not seem to be installed."
    continue
  fi
  mkdir -p "/lib/modules/$k/updates/dkms"
  for m in nvidia nvidia-uvm nvidia-modeset nvidia-drm; do
    echo "stand-in module built from $conf" > "/lib/modules/$k/updates/dkms/$m.ko.zst"
  done
  echo "dkms: $(dirname "$conf") built for kernel $k"
done
"""
DKMS_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ]; then
  for d in /lib/modules/*/; do
    [ -d "$d" ] && /usr/lib/dkms/sim-build "$(basename "$d")"
  done
fi
exit 0
"""
HEADERS_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /etc/kernel/header_postinst.d ]; then
  for hook in /etc/kernel/header_postinst.d/*; do [ -x "$hook" ] && "$hook" "@KERNEL@"; done
fi
exit 0
"""
MIG_MANAGER_UNIT = """[Unit]
Description=NVIDIA MIG Manager Service (capi-gpu simulation)
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=true
Environment=MIG_PARTED_SELECTED_CONFIG=all-disabled
ExecStart=/usr/bin/nvidia-mig-parted apply -f /etc/nvidia-mig-manager/config.yaml -c ${MIG_PARTED_SELECTED_CONFIG}

[Install]
WantedBy=multi-user.target
"""
MIG_MANAGER_CONFIG = """version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
"""
CDI_REFRESH_SERVICE = """[Unit]
Description=Refresh NVIDIA CDI specification file (capi-gpu simulation)

[Service]
Type=oneshot
ExecStart=/usr/bin/nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml
"""
CDI_REFRESH_PATH = """[Unit]
Description=Trigger CDI refresh on NVIDIA driver install / uninstall events (capi-gpu simulation)

[Path]
PathChanged=/lib/modules/%v/modules.dep

[Install]
WantedBy=multi-user.target
"""
CONTAINERD_UNIT = """[Unit]
Description=containerd container runtime (capi-gpu simulation)
After=network.target

[Service]
ExecStart=/usr/bin/containerd
Type=simple
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""
# What Docker's containerd.io ships: CRI off. The playbook must replace it.
CONTAINERD_DEFAULT_CONFIG = 'disabled_plugins = ["cri"]\n'
KUBELET_UNIT = """[Unit]
Description=kubelet: The Kubernetes Node Agent (capi-gpu simulation)
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""
KUBEADM_DROPIN = """[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
--kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""


def nvidia_packages(driver_branch: str) -> list[Package]:
    b = driver_branch
    version = DRIVER_VERSIONS[driver_branch] + "-1"
    return [
        # The ubuntu2404 CUDA repository's names up to branch 580: branch-suffixed, Ubuntu's layout (from 590
        # on NVIDIA drops the suffix and pins with nvidia-driver-pinning-<branch>; no stand-in for that yet).
        Package(
            f"nvidia-driver-{b}-open",
            version,
            NVIDIA,
            "NVIDIA driver metapackage, open kernel modules",
            _doc(f"nvidia-driver-{b}-open"),
            depends=(
                f"nvidia-dkms-{b}-open",
                f"nvidia-utils-{b}",
                f"nvidia-compute-utils-{b}",
                f"libnvidia-compute-{b}",
                f"libnvidia-gl-{b}",
            ),
        ),
        Package(
            f"nvidia-dkms-{b}-open",
            version,
            NVIDIA,
            "NVIDIA DKMS package (open kernel module)",
            {
                f"/usr/src/nvidia-{DRIVER_VERSIONS[b]}/dkms.conf": _unit(
                    f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{DRIVER_VERSIONS[b]}"\n'
                )
            },
            depends=("dkms",),
            postinst=DKMS_POSTINST,
        ),
        Package(
            f"nvidia-utils-{b}",
            version,
            NVIDIA,
            "NVIDIA driver support binaries: nvidia-smi (GPU shim)",
            {"/usr/bin/nvidia-smi": _nvidia_smi(DRIVER_VERSIONS[b]), SIM_MIG_PARTED: _gpu_shim("nvidia_mig_parted")},
        ),
        Package(
            f"libnvidia-compute-{b}",
            version,
            NVIDIA,
            "NVIDIA libcompute: NVML (a placeholder file: the DRA plugin's prestart looks for it)",
            {"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": _unit("placeholder, not a library\n")},
        ),
        Package(
            f"libnvidia-gl-{b}",
            version,
            NVIDIA,
            "NVIDIA OpenGL/GLX libraries (needs X libraries from the archive)",
            _doc(f"libnvidia-gl-{b}"),
            depends=("libx11-6", "libxext6"),
        ),
        Package(
            f"nvidia-compute-utils-{driver_branch}",
            version,
            NVIDIA,
            "NVIDIA compute utilities: nvidia-persistenced with Ubuntu's unit",
            {
                "/usr/bin/nvidia-persistenced": _script("persistenced", VERSION=version),
                "/lib/systemd/system/nvidia-persistenced.service": _unit(PERSISTENCED_UNIT),
            },
        ),
        *_pinning(b),
        Package(
            "nvidia-mig-manager",
            MIG_MANAGER_VERSION + "-1",
            NVIDIA,
            "nvidia-mig-parted (GPU shim)",
            {
                "/usr/bin/nvidia-mig-parted": _gpu_shim("nvidia_mig_parted"),
                "/lib/systemd/system/nvidia-mig-manager.service": _unit(MIG_MANAGER_UNIT),
                "/etc/nvidia-mig-manager/config.yaml": _unit(MIG_MANAGER_CONFIG),
            },
        ),
    ]


# What the stand-in of nvidia-driver-pinning-<branch> pins: the branch's versions of every NVIDIA package at
# 1000, whatever their origin. The real package's file is not in ../shared/reference; a pin by version alone is
# the hard case for the role, since it would lift the distribution's build of the same names too.
PINNING_PREFERENCES = """# NVIDIA driver branch @BRANCH@ (capi-gpu simulation of nvidia-driver-pinning-@BRANCH@)
Package: *nvidia*
Pin: version @BRANCH@.*
Pin-Priority: 1000
"""
PINNING_BRANCHES = ("580",)  # NVIDIA's noble repository has nvidia-driver-pinning-580; 575's is not known


def _pinning(branch: str) -> list[Package]:
    if branch not in PINNING_BRANCHES:
        return []
    name = f"nvidia-driver-pinning-{branch}"
    text = PINNING_PREFERENCES.replace("@BRANCH@", branch)
    return [Package(name, f"{branch}-1", NVIDIA, f"APT driver pinning file for driver branch {branch}",
                    {f"/etc/apt/preferences.d/{name}": _unit(text)})]  # fmt: skip


def other_packages(kubernetes_version: str) -> list[Package]:
    kube = kubernetes_version.removeprefix("v") + "-1.1"
    return [
        Package(
            "nvidia-container-toolkit",
            TOOLKIT_VERSION + "-1",
            TOOLKIT,
            "nvidia-ctk",
            {
                "/usr/bin/nvidia-ctk": _nvidia_ctk(),
                "/lib/systemd/system/nvidia-cdi-refresh.service": _unit(CDI_REFRESH_SERVICE),
                "/lib/systemd/system/nvidia-cdi-refresh.path": _unit(CDI_REFRESH_PATH),
            },
        ),
        Package(
            "containerd.io",
            CONTAINERD_VERSION + "-1",
            DOCKER,
            "containerd (validates its config, then idles)",
            {
                "/usr/bin/containerd": _script("containerd", VERSION=CONTAINERD_VERSION),
                "/lib/systemd/system/containerd.service": _unit(CONTAINERD_UNIT),
                "/etc/containerd/config.toml": _unit(CONTAINERD_DEFAULT_CONFIG),
            },
            provides=("containerd", "runc"),
            conflicts=("containerd", "runc"),
        ),
        Package(
            "kubelet",
            kube,
            KUBERNETES,
            "kubelet (idles; the test side simulates the node)",
            {
                "/usr/bin/kubelet": _script("idle", NAME="Kubernetes", VERSION=f"v{kube.split('-')[0]}", DAEMON="yes"),
                "/lib/systemd/system/kubelet.service": _unit(KUBELET_UNIT),
            },
            depends=("conntrack", "socat", "ethtool"),
        ),
        Package(
            "kubeadm",
            kube,
            KUBERNETES,
            "kubeadm (join/reset shim)",
            {
                **_kubeadm(),
                "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf": _unit(KUBEADM_DROPIN),
            },
            depends=("kubelet", "kubectl"),
        ),
        Package(
            "kubectl",
            kube,
            KUBERNETES,
            "kubectl (version only)",
            {
                "/usr/bin/kubectl": _script(
                    "idle", NAME="Client Version:", VERSION=f"v{kube.split('-')[0]}", DAEMON="no"
                ),
            },
        ),
    ]


def archive_packages(kernel_release: str) -> list[Package]:
    """What the distribution archive offers that the NVIDIA and Kubernetes packages need: DKMS and the build
    tools, the running kernel's headers (and the metapackages that follow kernel updates), X libraries, and
    kubelet's conntrack/socat/ethtool."""
    headers = f"linux-headers-{kernel_release}"
    # The headers of the kernel a simulated update brings mid-run (host_shims.kmod kernel-update): DKMS
    # builds that kernel's module once they are installed.
    following = host_shims.next_kernel(kernel_release)
    empty = [
        Package(name, "1.0-1", ARCHIVE, f"{name} (empty stand-in)", _doc(name))
        for name in ("gcc", "make", "libx11-6", "libxext6", "conntrack", "socat", "ethtool")
    ]
    return [
        *empty,
        Package(
            "dkms",
            "3.0.11-1",
            ARCHIVE,
            "Dynamic Kernel Module System (builds only where the kernel's headers are installed)",
            {
                "/usr/lib/dkms/sim-build": host_shims.GuestFile(DKMS_BUILD.encode()),
                "/etc/kernel/header_postinst.d/dkms": host_shims.GuestFile(DKMS_BUILD.encode()),
            },
            depends=("gcc", "make"),
        ),
        Package(
            headers,
            "1.0-1",
            ARCHIVE,
            f"kernel headers for {kernel_release}",
            {
                f"/usr/src/{headers}/Makefile": _unit("# stand-in kernel headers\n"),
                f"/lib/modules/{kernel_release}/build": _link(f"/usr/src/{headers}"),
            },
            postinst=HEADERS_POSTINST.replace("@KERNEL@", kernel_release),
        ),
        Package(
            f"linux-headers-{following}",
            "1.0-1",
            ARCHIVE,
            f"kernel headers for {following} (the simulated kernel update)",
            {
                f"/usr/src/linux-headers-{following}/Makefile": _unit("# stand-in kernel headers\n"),
                f"/lib/modules/{following}/build": _link(f"/usr/src/linux-headers-{following}"),
            },
            postinst=HEADERS_POSTINST.replace("@KERNEL@", following),
        ),
        # The flavour metapackages that pull the newest kernel's headers: Ubuntu's and Debian's (amd64).
        *[
            Package(meta, "1.0-1", ARCHIVE, "headers of the newest kernel (meta)", _doc(meta), depends=(headers,))
            for meta in ("linux-headers-generic", "linux-headers-amd64")
        ],
    ]


def _link(target: str) -> host_shims.GuestFile:
    return host_shims.GuestFile(b"", 0o777, link=target)


def packages(kubernetes_version: str, driver_branch: str = "580", kernel_release: str | None = None) -> list[Package]:
    """Every stand-in package for one cluster version, driver branch and (guest = test machine) kernel."""
    if driver_branch not in DRIVER_VERSIONS:
        raise ValueError(f"no stand-in driver for branch {driver_branch}; known: {sorted(DRIVER_VERSIONS)}")
    from capi_gpu_sim.apt_standins import ubuntu_nvidia  # imports this module's helpers

    release = kernel_release or os.uname().release
    ubuntu = ubuntu_nvidia.packages(driver_branch, (release, host_shims.next_kernel(release)))
    return nvidia_packages(driver_branch) + other_packages(kubernetes_version) + archive_packages(release) + ubuntu
